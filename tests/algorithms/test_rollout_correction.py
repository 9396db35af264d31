"""Rollout correction (verl's ``algorithm.rollout_correction``): importance weights, rejection masks
and metrics against numbers worked out by hand; the config's bad values; correction off leaves the
loss bit-identical; a one-step job with correction on logs ``rollout_corr/*`` (e2e)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers import FAST, SMALL

from rlforge.algorithms import PolicyLossInputs, compute_policy_loss
from rlforge.algorithms.rollout_correction import (
    compute_rollout_correction,
    is_weights,
    reinforce_loss_matrix,
    rejection_mask,
)
from rlforge.config import ActorConfig, load_config, validate_config
from rlforge.config.algorithm import RolloutCorrectionConfig
from rlforge.config.rollout_correction_check import parse_rs_options, parse_rs_thresholds
from rlforge.errors import ConfigError

# Two responses; the ratios r = pi_old / pi_rollout per token (row 1's last token is padding,
# its log-ratio a huge garbage value that must not matter).
R = [[1.5, 0.4, 3.0], [1.6, 1.5, None]]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
LOG_RATIO = torch.tensor([[math.log(1.5), math.log(0.4), math.log(3.0)], [math.log(1.6), math.log(1.5), 50.0]])
ROLLOUT = torch.full((2, 3), -1.0)
OLD = ROLLOUT + LOG_RATIO
RC = "algorithm.rollout_correction"


def _close(got: torch.Tensor, want: list[list[float]]) -> None:
    torch.testing.assert_close(got, torch.tensor(want), rtol=1e-5, atol=1e-6)


def test_token_weights_are_the_ratios_truncated_at_the_threshold() -> None:
    w, m = is_weights(LOG_RATIO, MASK, "token", 2.0)
    _close(w, [[1.5, 0.4, 2.0], [1.6, 1.5, 0.0]])  # 3.0 -> 2.0; padding -> 0
    assert not w.requires_grad
    assert float(m["rollout_is_mean"]) == pytest.approx((1.5 + 0.4 + 2.0 + 1.6 + 1.5) / 5)  # 1.4
    assert float(m["rollout_is_max"]) == pytest.approx(3.0) and float(m["rollout_is_min"]) == pytest.approx(0.4)
    assert float(m["rollout_is_ratio_fraction_high"]) == pytest.approx(1 / 5)  # 3.0 > 2
    assert float(m["rollout_is_ratio_fraction_low"]) == pytest.approx(1 / 5)  # 0.4 < 1/2


def test_sequence_weights_are_the_product_truncated() -> None:
    w, m = is_weights(LOG_RATIO, MASK, "sequence", 2.0)
    # row 0: 1.5 * 0.4 * 3.0 = 1.8; row 1: 1.6 * 1.5 = 2.4 -> 2.0
    _close(w, [[1.8, 1.8, 1.8], [2.0, 2.0, 0.0]])
    assert float(m["rollout_is_ratio_fraction_high"]) == pytest.approx(1 / 2)  # one of two sequences above 2
    assert float(m["rollout_is_max"]) == pytest.approx(2.4) and float(m["rollout_is_min"]) == pytest.approx(1.8)


@pytest.mark.parametrize(("level", "mean", "want"), [
    ("token", 1.4, [[1.5, 0.4, 2.0], [1.6, 1.5, 0.0]]),  # mean over the 5 valid tokens
    ("sequence", 1.9, [[1.8, 1.8, 1.8], [2.0, 2.0, 0.0]]),  # mean over the 2 sequences: (1.8 + 2.0) / 2
])
def test_batch_normalize_divides_by_the_mean_weight(level: str, mean: float, want: list[list[float]]) -> None:
    w, m = is_weights(LOG_RATIO, MASK, level, 2.0, batch_normalize=True)
    _close(w, [[x / mean for x in row] for row in want])
    assert float(m["rollout_is_batch_norm_factor"]) == pytest.approx(mean)


# k2 = 0.5 (log r)^2: 1.5 -> 0.0822, 0.4 -> 0.4198, 3.0 -> 0.6035, 1.6 -> 0.1105
# k3 = r - 1 - log r: 1.5 -> 0.0945, 0.4 -> 0.3163, 3.0 -> 0.9014, 1.6 -> 0.1300
@pytest.mark.parametrize(("rs", "threshold", "want"), [
    ("token_k1", "0.5_2.0", [[1, 0, 0], [1, 1, 0]]),  # keeps 0.5 <= r <= 2
    ("seq_sum_k1", 2, [[1, 1, 1], [0, 0, 0]]),  # one number u = 1/u_u; products 1.8 kept, 2.4 dropped
    ("token_k2", 0.5, [[1, 1, 0], [1, 1, 0]]),  # 0.6035 > 0.5
    ("seq_max_k3", 0.3, [[0, 0, 0], [1, 1, 0]]),  # row 0's max 0.9014 > 0.3; row 1's 0.13
    ("seq_mean_k3", 0.4, [[0, 0, 0], [1, 1, 0]]),  # row 0: (0.0945+0.3163+0.9014)/3 = 0.437; row 1: 0.112
    ("token_k1,seq_sum_k1", "0.5_2.0", [[1, 0, 0], [0, 0, 0]]),  # every criterion must pass
])
def test_rejection_masks(rs: str, threshold: object, want: list[list[int]]) -> None:
    mask, m = rejection_mask(LOG_RATIO, MASK, parse_rs_thresholds(parse_rs_options(rs), threshold))
    assert mask.tolist() == want and mask.dtype == MASK.dtype
    kept, valid = torch.tensor(want).sum().item(), 5
    assert float(m["rollout_rs_masked_fraction"]) == pytest.approx((valid - kept) / valid)


def test_seq_mean_k1_bounds() -> None:
    """The k1 statistic is -log r (verl): bounds ``l_u`` keep ``log l <= -mean log r <= log u``.
    Row 0: -mean log r = -log(1.8)/3 = -0.1959 (log 0.822); row 1: -log(2.4)/2 = -0.4377 (log 0.645)."""
    bounds = parse_rs_thresholds(["seq_mean_k1"], "0.7_1.0")  # keeps 0.7 <= 1/geomean <= 1
    mask, m = rejection_mask(LOG_RATIO, MASK, bounds)
    assert mask.tolist() == [[1, 1, 1], [0, 0, 0]]
    assert float(m["rollout_rs_seq_mean_k1_fraction_low"]) == pytest.approx(1 / 2)
    assert float(m["rollout_rs_seq_masked_fraction"]) == pytest.approx(1 / 2)


def test_offpolicy_metrics_by_hand() -> None:
    corr = compute_rollout_correction(OLD, ROLLOUT, MASK, RolloutCorrectionConfig())
    assert corr.weights is None and corr.response_mask is MASK
    m = {k.removeprefix("rollout_corr/"): float(v) for k, v in corr.metrics.items()}
    logs = [math.log(x) for x in (1.5, 0.4, 3.0, 1.6, 1.5)]
    assert m["kl"] == pytest.approx(-sum(logs) / 5, rel=1e-5)  # E[log pi_rollout - log pi_old]
    assert m["chi2_token"] == pytest.approx((2.25 + 0.16 + 9.0 + 2.56 + 2.25) / 5 - 1, rel=1e-5)  # 2.244
    assert m["chi2_seq"] == pytest.approx((1.8 ** 2 + 2.4 ** 2) / 2 - 1, rel=1e-5)  # 3.5
    assert m["rollout_ppl"] == pytest.approx(math.e, rel=1e-5)  # every rollout log-prob is -1


def test_compute_rollout_correction_prefixes_and_combines() -> None:
    cfg = RolloutCorrectionConfig(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
    corr = compute_rollout_correction(OLD, ROLLOUT, MASK, cfg)
    _close(corr.weights, [[1.5, 0.4, 2.0], [1.6, 1.5, 0.0]])  # weights from the unrejected mask, as verl
    assert corr.response_mask.tolist() == [[1, 0, 0], [1, 1, 0]]
    assert all(k.startswith("rollout_corr/") for k in corr.metrics)
    assert {"rollout_corr/rollout_is_mean", "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/kl"} <= set(
        corr.metrics)


def test_weights_multiply_the_policy_loss_per_token() -> None:
    """PPO at ratio 1 (old = current): token-mean loss = -mean(w * A) over valid tokens."""
    adv = torch.tensor([[1.0, -2.0, 0.5], [3.0, 1.0, 0.0]])
    w = torch.tensor([[1.5, 0.4, 2.0], [1.6, 1.5, 0.0]])
    logp = torch.zeros(2, 3)
    inputs = PolicyLossInputs(logp, logp.clone().requires_grad_(), adv, MASK.float(), rollout_is_weights=w)
    loss = compute_policy_loss(inputs, ActorConfig()).loss
    assert float(loss.detach()) == pytest.approx(-(1.5 * 1 + 0.4 * -2 + 2.0 * 0.5 + 1.6 * 3 + 1.5 * 1) / 5)  # -1.6
    # REINFORCE (bypass, loss_type=reinforce): -w * A * log pi
    lp = torch.tensor([[-1.0, -2.0, -0.5], [-0.1, -3.0, 0.0]])
    _close(reinforce_loss_matrix(lp, adv, w), [[1.5, -1.6, 0.5], [0.48, 4.5, 0.0]])


def test_correction_off_leaves_the_loss_bit_identical() -> None:
    """Off, the loss gets no weights (None); and weights of exactly 1 leave it bit-identical too."""
    g = torch.Generator().manual_seed(0)
    old, lp, adv = (torch.randn(4, 6, generator=g) for _ in range(3))
    mask = (torch.rand(4, 6, generator=g) > 0.2).float()
    cfg = ActorConfig()
    off = compute_rollout_correction(old, old + torch.randn(4, 6, generator=g), mask, RolloutCorrectionConfig())
    assert off.weights is None and off.response_mask is mask
    base = compute_policy_loss(PolicyLossInputs(old, lp, adv, mask), cfg).loss
    ones = compute_rollout_correction(old, old, mask, RolloutCorrectionConfig(rollout_is="token")).weights
    assert torch.equal(ones * mask, mask)
    weighted = compute_policy_loss(PolicyLossInputs(old, lp, adv, mask, rollout_is_weights=ones), cfg).loss
    assert torch.equal(base, weighted)


@pytest.mark.parametrize(("overrides", "key"), [
    ([f"{RC}.rollout_is=tokens"], f"{RC}.rollout_is"),
    ([f"{RC}.rollout_is_threshold=0"], f"{RC}.rollout_is_threshold"),
    ([f"{RC}.rollout_is_threshold=-1.5"], f"{RC}.rollout_is_threshold"),
    ([f"{RC}.rollout_rs=seq_max_k1", f"{RC}.rollout_rs_threshold=2"], f"{RC}.rollout_rs"),
    ([f"{RC}.rollout_rs=token_k1"], f"{RC}.rollout_rs_threshold"),
    ([f"{RC}.rollout_rs=token_k3", f"{RC}.rollout_rs_threshold=0.1_0.2"], f"{RC}.rollout_rs_threshold"),
    ([f"{RC}.rollout_rs=token_k3", f"{RC}.rollout_rs_threshold=-0.1"], f"{RC}.rollout_rs_threshold"),
    ([f"{RC}.rollout_rs=token_k1,token_k2,token_k3", f"{RC}.rollout_rs_threshold='2,3'"], f"{RC}.rollout_rs_threshold"),
    ([f"{RC}.loss_type=ppo"], f"{RC}.loss_type"),
    ([f"{RC}.rollout_is=token", "actor_rollout_ref.rollout.name=hf"], "actor_rollout_ref.rollout.name=hf"),
    ([f"{RC}.bypass_mode=true", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"], f"{RC}.bypass_mode"),
])
def test_bad_values_are_one_config_error_naming_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(load_config(overrides))


def test_mode_dependent_keys_warn_when_their_mode_is_off() -> None:
    warnings = validate_config(load_config([f"{RC}.loss_type=reinforce", f"{RC}.rollout_is_threshold=3"]))
    assert any(f"{RC}.loss_type=reinforce" in w and "bypass_mode" in w for w in warnings)
    assert any(f"{RC}.rollout_is_threshold=3.0" in w for w in warnings)


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [
    [f"{RC}.rollout_is=sequence", f"{RC}.rollout_rs=token_k1,seq_mean_k3", f"{RC}.rollout_rs_threshold='0.5_2.0,0.1'"],
    [f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce", f"{RC}.rollout_is=token"],
], ids=["decoupled", "bypass"])
def test_one_step_with_correction_logs_its_metrics(tmp_path, extra: list[str]) -> None:
    """calculate_log_probs is left at its default (false): correction turns it on."""
    from rlforge.cli import main

    out = tmp_path / "run"
    args = [*SMALL, *FAST, "trainer.total_training_steps=1", f"trainer.default_local_dir={out}",
            "algorithm.adv_estimator=grpo", *extra]
    assert main(["train", *args]) == 0
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    for name in ("rollout_is_mean", "rollout_is_eff_sample_size", "kl", "chi2_token", "training_ppl"):
        assert math.isfinite(row[f"rollout_corr/{name}"]), name
    assert math.isfinite(row["actor/pg_loss"])
    if "bypass" in extra[0]:
        assert "timing_s/old_log_prob" not in row  # the rollout's log-probs are the old ones
    else:
        assert "rollout_corr/rollout_rs_masked_fraction" in row

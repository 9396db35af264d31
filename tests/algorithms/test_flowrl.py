"""FlowRL loss: hand case, weight clamp, raw vs group_norm, use_ref off, missing inputs, invariance."""

import dataclasses
import math
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlforge.algorithms import PolicyLossInputs, compute_policy_loss, loss_agg_globals
from rlforge.config.actor import FlowRLConfig
from rlforge.errors import ConfigError

D = torch.float64
# Two sequences of one group; valid lengths 2 and 3.  Scores 1 and 0.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=D)
LOGP = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -1.0, -1.5]], dtype=D)  # means -1.5, -1.0
REF = torch.tensor([[-1.2, -1.8, -5.0], [-1.0, -1.0, -1.0]], dtype=D)  # means -1.5, -1.0
OLD = LOGP - torch.tensor([[0.1, 0.2, 7.0], [1.0, 1.0, 0.5]], dtype=D)  # sum log ratio 0.3, 2.5
REWARDS = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]], dtype=D)
LOG_Z = torch.tensor([0.3, -0.2], dtype=D)
R_HAT = 0.5 / (statistics.stdev([1.0, 0.0]) + 1e-6)  # group-normalized: +R_HAT, -R_HAT


def _cfg(**kw):
    base = dict(beta=2.0)
    base.update(kw)
    return SimpleNamespace(policy_loss=SimpleNamespace(loss_mode="flowrl", flowrl=FlowRLConfig(**base)))


def _inputs(ref=REF, index=("g", "g"), log_z=LOG_Z, **kw):
    lp = LOGP.clone().requires_grad_(True)
    lz = None if log_z is None else log_z.clone().requires_grad_(True)
    idx = None if index is None else np.array(index, dtype=object)
    return PolicyLossInputs(OLD, lp, torch.zeros_like(LOGP), MASK, ref_log_prob=ref, token_level_rewards=REWARDS,
                            index=idx, log_z=lz, **kw)


def _expected(deltas, weights):
    return sum(w * d * d for w, d in zip(weights, deltas, strict=True)) / len(deltas)


def test_hand_case_group_norm():
    inp = _inputs()
    out = compute_policy_loss(inp, _cfg())
    # delta = log Z + mean log pi - beta * r_hat - mean log pi_ref; the policy and ref means cancel here
    d0, d1 = 0.3 - 2 * R_HAT, -0.2 + 2 * R_HAT
    w0, w1 = math.exp(0.3), 10.0  # exp(2.5) = 12.18 is clamped to 10
    assert out.loss.item() == pytest.approx(_expected([d0, d1], [w0, w1]), abs=1e-9)
    out.loss.backward()
    # dL/dlogZ_i = w_i * delta_i (the 2 of the square and the mean over 2 sequences cancel);
    # dL/dlogp_{i,t} = w_i * delta_i / len_i on valid tokens
    torch.testing.assert_close(inp.log_z.grad, torch.tensor([w0 * d0, w1 * d1], dtype=D))
    expected_lp = torch.tensor([[w0 * d0 / 2] * 2 + [0.0], [w1 * d1 / 3] * 3], dtype=D)
    torch.testing.assert_close(inp.log_prob.grad, expected_lp)
    m = out.metrics
    assert m["flowrl/log_z_mean"] == pytest.approx(0.05)
    assert m["flowrl/delta_sq_mean"] == pytest.approx((d0 * d0 + d1 * d1) / 2)
    assert m["flowrl/weight_mean"] == pytest.approx((w0 + w1) / 2)
    assert m["flowrl/weight_max"] == pytest.approx(math.exp(2.5))
    assert m["flowrl/weight_clipfrac"] == pytest.approx(0.5)


def test_raw_reward():
    out = compute_policy_loss(_inputs(index=None), _cfg(reward="raw"))
    d0, d1 = 0.3 - 2 * 1.0, -0.2 - 2 * 0.0  # r_hat = score
    assert out.loss.item() == pytest.approx(_expected([d0, d1], [math.exp(0.3), 10.0]), abs=1e-9)


def test_use_ref_off_drops_reference_term():
    out = compute_policy_loss(_inputs(ref=None), _cfg(use_ref=False))
    d0, d1 = 0.3 - 1.5 - 2 * R_HAT, -0.2 - 1.0 + 2 * R_HAT
    assert out.loss.item() == pytest.approx(_expected([d0, d1], [math.exp(0.3), 10.0]), abs=1e-9)


def test_weight_clamps():
    d0, d1 = 0.3 - 2 * R_HAT, -0.2 + 2 * R_HAT
    out = compute_policy_loss(_inputs(), _cfg(weight_clamp_min=2.0, weight_clamp_max=None))
    assert out.loss.item() == pytest.approx(_expected([d0, d1], [2.0, math.exp(2.5)]), abs=1e-9)
    assert out.metrics["flowrl/weight_clipfrac"] == pytest.approx(0.5)
    out = compute_policy_loss(_inputs(), _cfg(weight_clamp_max=1.0))
    assert out.loss.item() == pytest.approx(_expected([d0, d1], [1.0, 1.0]), abs=1e-9)
    assert out.metrics["flowrl/weight_clipfrac"] == pytest.approx(1.0)


def test_single_response_group_is_finite():
    out = compute_policy_loss(_inputs(index=("a", "b")), _cfg())
    # groups of one: mean 0, std 1 (as GRPO) -> r_hat = score / (1 + 1e-6)
    d0, d1 = 0.3 - 2 * 1.0 / (1 + 1e-6), -0.2
    assert out.loss.item() == pytest.approx(_expected([d0, d1], [math.exp(0.3), 10.0]), abs=1e-9)


@pytest.mark.parametrize(
    ("kwargs", "cfg", "needle"),
    [
        ({"log_z": None}, {}, "log_z"),
        ({"ref": None}, {}, "use_ref"),
        ({"index": None}, {}, "reward=group_norm"),
        ({}, {"reward": "rank"}, "flowrl.reward='rank'"),
    ],
)
def test_missing_inputs_name_the_fix(kwargs, cfg, needle):
    with pytest.raises(ValueError, match=needle) as err:
        compute_policy_loss(_inputs(**kwargs), _cfg(**cfg))
    assert isinstance(err.value, ConfigError)


@pytest.mark.parametrize("reward", ["group_norm", "raw"])
def test_micro_batch_invariance(reward):
    g = torch.Generator().manual_seed(7)
    b, r = 6, 4
    old = -torch.rand(b, r, generator=g, dtype=D) * 2
    new = old + 0.2 * torch.randn(b, r, generator=g, dtype=D)
    ref = old + 0.1 * torch.randn(b, r, generator=g, dtype=D)
    rewards = torch.zeros(b, r, dtype=D)
    rewards[:, 0] = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.5], dtype=D)
    mask = (torch.arange(r)[None, :] < torch.tensor([4, 2, 3, 1, 4, 2])[:, None]).to(D)
    index = np.array(["a", "a", "b", "b", "c", "c"], dtype=object)
    log_z = torch.randn(b, generator=g, dtype=D)
    cfg = _cfg(beta=1.5, weight_clamp_max=1.1, reward=reward)

    def run(sl, lp, lz, glob):
        inp = PolicyLossInputs(old[sl], lp[sl], torch.zeros_like(old[sl]), mask[sl], ref_log_prob=ref[sl],
                               token_level_rewards=rewards[sl], index=index[sl], log_z=lz[sl], **glob)
        return compute_policy_loss(inp, cfg).loss

    lp_full, lz_full = new.clone().requires_grad_(True), log_z.clone().requires_grad_(True)
    full = run(slice(0, b), lp_full, lz_full, {})
    full.backward()
    lp, lz = new.clone().requires_grad_(True), log_z.clone().requires_grad_(True)
    glob = loss_agg_globals(mask)
    # group_norm needs whole groups per micro-batch; raw may split anywhere
    splits = (slice(0, 2), slice(2, 6)) if reward == "group_norm" else (slice(0, 1), slice(1, 4), slice(4, 6))
    total = 0.0
    for sl in splits:
        part = run(sl, lp, lz, glob)
        part.backward()
        total += part.item()
    assert total == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(lp.grad, lp_full.grad, atol=1e-12, rtol=0)
    torch.testing.assert_close(lz.grad, lz_full.grad, atol=1e-12, rtol=0)
    assert lz.grad.abs().sum() > 0


def test_flowrl_config_defaults():
    f = FlowRLConfig()
    assert dataclasses.asdict(f) == {
        "beta": 15.0, "reward": "group_norm", "use_ref": True, "weight_clamp_max": 10.0, "weight_clamp_min": None,
        "log_z_hidden_size": 256, "export_log_z": False, "log_z_lr_multiplier": 1.0,
    }

"""Skipping the ``old_log_prob`` stage on-policy (rlforge/trainer/on_policy.py,
``Actor.update(on_policy=True)``): when one batch feeds one optimizer step, the update's own
forward gives the old log-probs.  Checked against the two-forward path (same gradient, same
log-probs and entropies as ``compute_log_prob``), against a hand-written policy gradient, for
the config decision, and through a CPU training run."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from helpers import FAST, SMALL, GradCapture, left_padded_batch
from reference_engine import LocalEngine

from rlforge.cli import main
from rlforge.config import ActorConfig
from rlforge.errors import ConfigError
from rlforge.roles.actor import Actor

TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def model(spread_tiny_model):
    return spread_tiny_model


@pytest.fixture(scope="module")
def batch(tiny_tokenizer):
    """6 rows, prompts of 2..7 tokens, responses of 1..8 valid tokens, random advantages."""
    b = left_padded_batch(tiny_tokenizer.pad_token_id, 2, [2, 7, 4, 5, 3, 6], [0, 7, 3, None, 5, 1], 8)
    g = torch.Generator().manual_seed(1)
    b["advantages"] = torch.randn(b["responses"].shape, generator=g) * b["response_mask"].float()
    return b


def _actor(model, n: int, micro: int, entropy_coeff: float = 0.0, token_budget: int | None = None):
    cfg = ActorConfig()
    cfg.grad_clip = 0.0
    cfg.entropy_coeff = entropy_coeff
    opt = GradCapture(model.parameters())
    engine = LocalEngine(model, torch.device("cpu"), opt, None, grad_clip=0.0)
    return Actor(engine, cfg, mini_batch_size=n, micro_batch_size=micro, log_prob_micro_batch_size=4,
                 max_token_len=token_budget), opt


@pytest.mark.parametrize(("micro", "budget"), [(6, None), (2, None), (6, 24)], ids=["one-micro", "micro-2", "dynamic"])
def test_on_policy_update_equals_the_two_forward_update(model, batch, micro, budget):
    """Same gradient as old_log_probs from a separate compute_log_prob forward; the recorded
    log-probs and entropies equal that forward's, row by row in the batch's order."""
    b = copy.copy(batch)
    b.tensors = batch.tensors.clone()
    actor, opt = _actor(model, len(b), micro, token_budget=budget)
    ref = actor.compute_log_prob(b, TEMPERATURE, with_entropy=True)
    two = b.tensors.clone()
    two["old_log_probs"] = ref["log_probs"]
    b2 = copy.copy(b)
    b2.tensors = two
    actor.update(b2, TEMPERATURE)
    g_two = opt.grads.clone()
    result = actor.update(b, TEMPERATURE, on_policy=True)
    m, forward = result.metrics, result.forward
    g_one = opt.grads.clone()
    assert float((g_one - g_two).norm() / g_two.norm()) < 1e-5
    mask = b["response_mask"].bool()
    torch.testing.assert_close(forward["log_probs"][mask], ref["log_probs"][mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(forward["entropys"][mask], ref["entropys"][mask], atol=1e-5, rtol=1e-5)
    assert (forward["log_probs"][~mask] == 0).all()
    assert m["ppo_kl"] == 0.0 and m["pg_clipfrac"] == 0.0  # ratio exactly 1


def test_on_policy_gradient_is_the_plain_policy_gradient(model, batch):
    """Ratio 1 with a detached old: d/dθ of token-mean(-A · exp(logp - sg(logp))) = token-mean(-A · ∇logp)."""
    b = copy.copy(batch)
    b.tensors = batch.tensors.clone()
    actor, opt = _actor(model, len(b), 3)
    actor.update(b, TEMPERATURE, on_policy=True)
    model.zero_grad(set_to_none=True)
    model.train()
    R, T = b["responses"].shape[1], b["input_ids"].shape[1]
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                   position_ids=b["position_ids"]).logits[:, T - R - 1: T - 1].float() / TEMPERATURE
    logp = torch.log_softmax(logits, -1).gather(-1, b["responses"].unsqueeze(-1)).squeeze(-1)
    mask = b["response_mask"].float()
    (-(b["advantages"] * logp * mask).sum() / mask.sum()).backward()
    want = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    assert float((opt.grads - want).norm() / want.norm()) < 1e-5


def test_on_policy_update_refuses_more_than_one_step(model, batch):
    actor, _ = _actor(model, 3, 3)
    with pytest.raises(ValueError, match="one optimizer step"):
        actor.update(batch, TEMPERATURE, on_policy=True)


ON_POLICY = ["actor_rollout_ref.actor.ppo_mini_batch_size=4"]  # = data.train_batch_size in SMALL


def _run(tmp: Path, *extra: str) -> list[dict]:
    rc = main(["train", *SMALL, *FAST, f"trainer.default_local_dir={tmp}", "trainer.total_training_steps=2", *extra])
    assert rc == 0
    return [json.loads(line) for line in (tmp / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.e2e
def test_training_run_skips_the_stage_only_when_on_policy(tmp_path):
    skipped = _run(tmp_path / "a", *ON_POLICY, "actor_rollout_ref.rollout.calculate_log_probs=true")
    forced = _run(tmp_path / "b", *ON_POLICY, "actor_rollout_ref.actor.recompute_old_log_prob=true")
    off_policy = _run(tmp_path / "c")  # ppo_mini_batch_size=2 < train_batch_size=4
    for r in skipped:
        assert "timing_s/old_log_prob" not in r
        assert r["actor/entropy"] > 0 and r["actor/ppo_kl"] == 0.0
        assert 0 <= r["training/rollout_probs_diff_mean"] < 1e-3  # rollout vs the update's forward
    for rows in (forced, off_policy):
        assert all("timing_s/old_log_prob" in r and r["actor/entropy"] > 0 for r in rows)
    # same seed, same batches, same first update: the first step's entropy is the same number
    assert skipped[0]["actor/entropy"] == pytest.approx(forced[0]["actor/entropy"], rel=1e-4)


@pytest.mark.parametrize(("extra", "why"), [
    (["actor_rollout_ref.actor.ppo_mini_batch_size=2"], "more than one optimizer step"),
    ([*ON_POLICY, "actor_rollout_ref.actor.ppo_epochs=2"], "ppo_epochs=2"),
    ([*ON_POLICY, "algorithm.use_kl_in_reward=true"], "use_kl_in_reward"),
])
def test_forced_skip_off_policy_is_one_config_error(tmp_path, capsys, extra, why):
    rc = main(["train", *SMALL, *FAST, f"trainer.default_local_dir={tmp_path}", *extra,
               "actor_rollout_ref.actor.recompute_old_log_prob=false"])
    err = capsys.readouterr().err
    assert rc != 0 and "recompute_old_log_prob=False" in err and why in err
    assert "Traceback" not in err


def test_decision_table():
    from rlforge.config.loader import load_config  # noqa: PLC0415
    from rlforge.trainer.on_policy import skips_old_log_prob

    def cfg(*o: str):
        return load_config(["actor_rollout_ref.model.path=preset:tiny", "data.train_batch_size=8", *o])

    assert skips_old_log_prob(cfg("actor_rollout_ref.actor.ppo_mini_batch_size=8"))
    assert not skips_old_log_prob(cfg("actor_rollout_ref.actor.ppo_mini_batch_size=4"))
    assert not skips_old_log_prob(cfg("actor_rollout_ref.actor.ppo_mini_batch_size=8",
                                      "actor_rollout_ref.actor.recompute_old_log_prob=true"))
    with pytest.raises(ConfigError, match="ppo_mini_batch_size=4"):
        skips_old_log_prob(cfg("actor_rollout_ref.actor.ppo_mini_batch_size=4",
                               "actor_rollout_ref.actor.recompute_old_log_prob=false"))

"""Every advantage estimator and policy loss runs one RL step from the command line.

The runs use ``builtin:distribution`` (continuous rewards, so advantages are not all 0)
with ``preset:tiny``; the checks compare the logged metrics with what each algorithm must
produce (its extra stage, its metrics, finite losses, zero-mean group advantages).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rlforge.algorithms import ADV_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
from rlforge.cli import main
from rlforge.trainer.dcp_io import saved_model_state

pytestmark = pytest.mark.e2e

DIST = [
    "actor_rollout_ref.model.path=preset:tiny",
    "actor_rollout_ref.model.tokenizer_path=builtin:integers",
    "trainer.device=cpu",
    "data.train_files=builtin:distribution",
    "data.val_files=null",
    "data.max_prompt_length=16",
    "data.max_response_length=1",
    "data.train_batch_size=2",
    "data.builtin.train_size=8",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.logger=[file]",
]


GDPO_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    acc = (sum(map(ord, solution_str)) % 5) / 4.0
    fmt = float(len(solution_str.strip()) % 2)
    return {"score": acc + fmt, "accuracy_reward": acc, "format_reward": fmt}
"""
"""A reward function with two named components, for ``algorithm.adv_estimator=gdpo``."""


def needed_overrides(tmp: Path, name: str) -> list[str]:
    """The settings estimator or loss ``name`` cannot run without (verl requires them too)."""
    arr = "actor_rollout_ref.actor"
    if name == "dro":
        return [f"{arr}.policy_loss.dro_beta=0.05"]
    if name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        return [f"{arr}.calculate_sum_pi_squared=true"]
    if name == "gdpo":
        path = tmp / "gdpo_reward.py"
        path.write_text(GDPO_REWARD)
        return [f"custom_reward_function.path={path}", "algorithm.gdpo_reward_keys=[accuracy_reward,format_reward]",
                "algorithm.gdpo_reward_weights=[1.0,0.5]"]
    return []


def one_step(tmp: Path, *extra: str) -> dict:
    assert main(["train", *DIST, f"trainer.default_local_dir={tmp}", *extra]) == 0
    rows = [json.loads(line) for line in (tmp / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    return rows[0]


@pytest.mark.parametrize("name", ADV_ESTIMATORS.names())
def test_every_advantage_estimator_runs_from_the_cli(tmp_path, name):
    extra = [f"algorithm.adv_estimator={name}", *needed_overrides(tmp_path, name)]
    row = one_step(tmp_path, *extra)
    assert all(math.isfinite(row[k]) for k in ("critic/advantages/mean", "actor/pg_loss", "actor/grad_norm"))
    assert ("timing_s/gen_max" in row) == (name == "remax")
    assert ("timing_s/values" in row) == (name == "gae")
    if name in ("grpo", "rloo", "gdpo"):  # group-centred (gdpo: whitened) estimators: advantages average 0
        assert abs(row["critic/advantages/mean"]) < 1e-5
    if name.endswith("optimal_token_baseline"):  # needs the old policy's sum pi^2 before the update
        assert "timing_s/old_log_prob" in row
    if name == "gdpo":
        assert {"gdpo/accuracy_reward/mean", "gdpo/format_reward/std"} <= set(row)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_policy_loss_runs_from_the_cli(tmp_path, name):
    row = one_step(tmp_path, f"actor_rollout_ref.actor.policy_loss.loss_mode={name}", *needed_overrides(tmp_path, name))
    assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["actor/grad_norm"])
    assert row["actor/grad_norm"] > 0  # continuous rewards: every loss must move the policy
    if name == "flowrl":
        for k in ("log_z_mean", "delta_sq_mean", "weight_mean", "weight_max"):
            assert f"actor/flowrl/{k}" in row
        assert "timing_s/ref" in row  # flowrl.use_ref defaults to true
        # on-policy: the sequence importance weight is exactly 1
        assert row["actor/flowrl/weight_mean"] == pytest.approx(1.0, abs=1e-5)


def test_flowrl_without_reference_skips_the_ref_stage(tmp_path):
    row = one_step(
        tmp_path, "actor_rollout_ref.actor.policy_loss.loss_mode=flowrl",
        "actor_rollout_ref.actor.policy_loss.flowrl.use_ref=false",
        "actor_rollout_ref.actor.policy_loss.flowrl.reward=raw",
    )
    assert "timing_s/ref" not in row


def test_dr_grpo_settings_run(tmp_path):
    row = one_step(
        tmp_path, "algorithm.norm_adv_by_std_in_grpo=false",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
    )
    assert abs(row["critic/advantages/mean"]) < 1e-5


def test_dro_with_token_sum_runs(tmp_path):
    row = one_step(tmp_path, "actor_rollout_ref.actor.policy_loss.loss_mode=dro",
                   "actor_rollout_ref.actor.policy_loss.dro_beta=0.05", "actor_rollout_ref.actor.loss_agg_mode=token-sum")
    assert math.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0


def test_dynamic_sampling_keeps_groups_with_spread(tmp_path):
    row = one_step(tmp_path, "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=score")
    # continuous rewards: every group has spread, so one generation batch is enough
    assert row["filter_groups/kept"] == 2 and row["filter_groups/dropped"] == 0
    assert row["train/num_gen_batches"] == 1


def test_overlong_shaping_is_logged(tmp_path):
    row = one_step(
        tmp_path, "reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=1",
        "reward_model.overlong_buffer.penalty_factor=0.5",
    )
    # every response has length 1 = max_response_length: penalty -0.5 each
    assert row["reward_extra/overlong_reward/mean"] == pytest.approx(-0.5)


@pytest.mark.parametrize("name", KL_ESTIMATORS.names())
def test_every_kl_estimator_runs_as_kl_loss(tmp_path, name):
    row = one_step(tmp_path, "actor_rollout_ref.actor.use_kl_loss=true", f"actor_rollout_ref.actor.kl_loss_type={name}")
    # the first update starts at the reference weights: every estimator's KL is 0 there
    assert row["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("export_log_z", [False, True])
def test_hf_export_leaves_out_the_log_z_head_unless_asked(tmp_path, export_log_z):
    import torch

    from rlforge.models import load_causal_lm, load_tokenizer

    one_step(
        tmp_path, "actor_rollout_ref.actor.policy_loss.loss_mode=flowrl", "trainer.save_freq=1",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]",
        f"actor_rollout_ref.actor.policy_loss.flowrl.export_log_z={str(export_log_z).lower()}",
    )
    hf = tmp_path / "global_step_1" / "actor" / "huggingface"
    assert (hf / "log_z_head.safetensors").exists() == export_log_z
    tok = load_tokenizer(str(hf))
    exported = load_causal_lm(str(hf), tok).state_dict()
    state = saved_model_state(tmp_path / "global_step_1")
    assert not any("log_z" in k for k in exported)
    for k, v in exported.items():
        assert torch.equal(v, state[f"lm.{k}"]), k

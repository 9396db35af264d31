"""Token-budget micro-batches and the padding-free forward change no number of an RL step.

The same seeded step runs with fixed micro-batches and padded forwards, then with
``use_dynamic_bsz`` (a budget that forces several uneven micro-batches) and
``use_remove_padding``: the rollout, the old log-probs (entropy), the loss and the
gradient norm must agree.
"""

from __future__ import annotations

import json

import pytest

from rlforge.cli import main

pytestmark = pytest.mark.e2e

BASE = [
    "actor_rollout_ref.model.path=preset:tiny",
    "+actor_rollout_ref.model.override_config.initializer_range=0.2",
    "trainer.device=cpu",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "data.max_response_length=8",
    "data.max_prompt_length=64",
    "data.builtin.train_size=16",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.logger=[file]",
    "actor_rollout_ref.actor.entropy_coeff=0.01",
]


def step(tmp, *extra):
    assert main(["train", *BASE, f"trainer.default_local_dir={tmp}", *extra]) == 0
    return json.loads((tmp / "metrics.jsonl").read_text().splitlines()[-1])


def test_dynamic_bsz_and_remove_padding_match_fixed_padded(tmp_path):
    ref = step(tmp_path / "fixed")
    dyn = step(
        tmp_path / "dyn", "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=130", "actor_rollout_ref.model.use_remove_padding=true",
    )
    assert dyn["response_length/mean"] == ref["response_length/mean"]
    for key in ("actor/entropy", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert dyn[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key


def test_flowrl_group_norm_does_not_depend_on_the_micro_batch_split(tmp_path):
    """FlowRL's group-normalised reward target is computed over the whole batch before the split:
    token budgets that cut the groups differently give the same loss and gradient norm (before the
    fix, group statistics came from each micro-batch's share of a group: pg_loss 82.2 against 168.1)."""
    reward = tmp_path / "reward.py"
    reward.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return (sum(map(ord, solution_str)) % 7) / 7\n")
    flow = ["actor_rollout_ref.actor.policy_loss.loss_mode=flowrl", f"custom_reward_function.path={reward}",
            "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.use_dynamic_bsz=true"]
    small = step(tmp_path / "small", *flow, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=80")
    large = step(tmp_path / "large", *flow, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4000")
    assert small["response_length/mean"] == large["response_length/mean"]
    assert small["critic/score/max"] > small["critic/score/min"]  # the group-normalised target is not all zeros
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert small[key] == pytest.approx(large[key], rel=1e-4, abs=1e-6), key

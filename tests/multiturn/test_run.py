"""``rlforge train`` with ``multi_turn.enable=true``: the agent loop is the trainer's rollout, and its
metrics and log-probs reach the step (one CPU step on ``preset:tiny`` and ``builtin:tool_arithmetic``)."""

from __future__ import annotations

import json

import pytest

from rlforge.cli import main
from rlforge.data.tasks import BUILTIN_TASKS

R = "actor_rollout_ref.rollout"
ARGS = [
    "actor_rollout_ref.model.path=preset:tiny", "trainer.device=cpu",
    "data.train_files=builtin:tool_arithmetic", "data.val_files=builtin:tool_arithmetic",
    "data.train_batch_size=2", f"{R}.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "data.max_response_length=24", "data.max_prompt_length=192", "data.builtin.train_size=8",
    "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.test_freq=-1",
    "trainer.logger=[file]", f"{R}.name=native", f"{R}.calculate_log_probs=true",
    f"+{R}.multi_turn.enable=true", f"+{R}.multi_turn.tool_config_path=builtin:calculator",
]


@pytest.mark.e2e
def test_train_step_runs_the_agent_loop(tmp_path):
    assert main(["train", *ARGS, f"trainer.default_local_dir={tmp_path}"]) == 0
    m = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert m["num_turns/min"] >= 2 and "multi_turn/tool_calls/mean" in m and "rollout/multi_turn_tokens_per_s" in m
    assert m["training/rollout_probs_diff_max"] < 1e-3


def test_tool_arithmetic_rows():
    rows = BUILTIN_TASKS.get("tool_arithmetic")(split="train", size=4, difficulty=3, seed=1)
    val = BUILTIN_TASKS.get("tool_arithmetic")(split="val", size=4, difficulty=3, seed=1)
    for r in rows:
        q = r["prompt"][-1]["content"]
        a, b = (int(x) for x in q.removeprefix("What is ").removesuffix("?").split(" * "))
        assert len(str(a)) == len(str(b)) == 4 and r["reward_model"]["ground_truth"] == str(a * b)
        assert "<tool_call>" in r["prompt"][0]["content"]
    assert not {r["prompt"][-1]["content"] for r in rows} & {r["prompt"][-1]["content"] for r in val}

"""``rlforge train`` with ``strategy=megatron``, TP=2 x PP=2 on 4 gloo processes (CPU, preset:tiny).

The actor and the reference (KL loss, the reference's sizes follow the actor's) run on the
megatron engine; two steps complete, the placement metrics are logged, and the checkpoint (full,
plain state dicts) resumes in a single process.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_multiprocess_train import failure, rlforge  # noqa: E402

pytestmark = pytest.mark.e2e

MEGATRON = [
    "trainer.n_gpus_per_node=4",
    "actor_rollout_ref.actor.strategy=megatron",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
    "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
]


def test_four_process_tp2_pp2_training_then_single_process_resume(tmp_path):
    res = rlforge(*MEGATRON, "trainer.total_training_steps=2", "trainer.save_freq=2",
                  f"trainer.default_local_dir={tmp_path}")
    assert res.returncode == 0, failure(res)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["actor/grad_norm"] > 0
        assert (r["parallel/tp"], r["parallel/pp"], r["parallel/dp"]) == (2.0, 2.0, 1.0)
        assert 0.0 < r["parallel/pp_bubble"] < 1.0
    assert rows[0]["actor/kl_loss"] == 0.0 < abs(rows[1]["actor/kl_loss"])  # the actor moved away from the reference
    assert (tmp_path / "global_step_2" / "actor" / "state.pt").exists()
    res = rlforge("trainer.total_training_steps=3", "actor_rollout_ref.actor.use_kl_loss=true",
                  f"trainer.default_local_dir={tmp_path}")
    assert res.returncode == 0, failure(res)
    assert "resumed from" in res.stdout
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]

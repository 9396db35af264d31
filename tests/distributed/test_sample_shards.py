"""Sample-level sharding (:mod:`rlforge.config.sharding`, ``samples`` layout): ``train_batch_size=1``
with ``n=4`` in one process against 2 gloo ranks holding 2 samples each.  GRPO's group statistics
must be those of the whole group of 4 on both (hand-computed below; a rank that normalised its own
2 samples would give +-0.7071), and the first actor step must agree: losses and updated weights within 1e-6 (the gradient norm,
summed in another order, within 1e-5 relative)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import dist_common as dc  # noqa: E402
import shard_worker  # noqa: E402

OPTS = {"mode": "seq-mean-token-mean"}


@pytest.mark.e2e
def test_one_process_equals_two_ranks_sharing_a_group(tmp_path):
    one_dir, two_dir = tmp_path / "one", tmp_path / "two"
    one_dir.mkdir()
    two_dir.mkdir()
    shard_worker.run(one_dir, OPTS)  # in this process: a one-rank group made in-process
    dc.run_ranks([shard_worker.__file__, str(two_dir), json.dumps(OPTS)], 2, timeout=180)
    one = torch.load(one_dir / "result.pt", weights_only=False)
    two = torch.load(two_dir / "result.pt", weights_only=False)
    assert (one["world"], two["world"]) == (1, 2)
    # scores [1, 0, 0, 1]: mean 0.5, unbiased std sqrt(1/3); (score - mean) / (std + 1e-6)
    hand = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    for res in (one, two):
        adv, mask = res["adv"], res["adv"] != 0
        per_sample = [float(adv[i][mask[i]][0]) for i in range(4)]
        assert per_sample == pytest.approx([hand, -hand, -hand, hand], abs=1e-6)
    assert torch.allclose(one["adv"], two["adv"], atol=1e-6)
    for k in ("pg_loss", "kl_loss"):
        assert one["metrics"][k] == pytest.approx(two["metrics"][k], rel=1e-6, abs=1e-6), k
    # the norm of a gradient summed in another order (two ranks' halves): float32 noise, ~3e-6 relative
    assert one["metrics"]["grad_norm"] == pytest.approx(two["metrics"]["grad_norm"], rel=1e-5)
    # AdamW's first step is g / (|g| + 1e-8) per element: an element whose gradient is near 1e-8 moves by a
    # fraction of the lr (1e-3) on summation-order noise (4.4e-6 seen in CI); a wrong group would move by ~lr
    dc.close_states(one["state"], two["state"], atol=5e-5)


SMALL = ["data.max_response_length=2", "data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "trainer.n_gpus_per_node=2",
         "trainer.total_training_steps=2", "trainer.save_freq=-1"]


@pytest.mark.e2e
@pytest.mark.parametrize("extra", [
    # samples: 1 prompt x n=4 on 2 ranks, 2 samples each
    ["actor_rollout_ref.rollout.n=4"],
    # replica_samples: 1 sample on pp=2 x dp=1; rank 0 (which logs) holds none
    ["actor_rollout_ref.rollout.n=1", "actor_rollout_ref.actor.strategy=megatron",
     "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2", "trainer.balance_batch=false"],
], ids=["samples", "replica_samples"])
def test_rlforge_train_with_fewer_prompts_than_ranks(tmp_path, extra):
    from test_multiprocess_train import failure, rlforge

    res = rlforge(*SMALL, *extra, f"trainer.default_local_dir={tmp_path}")
    assert res.returncode == 0, failure(res)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        finite = {k: v for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)}
        assert not finite, finite  # an empty rank must not bring a NaN into the logged means
        assert r["response_length/mean"] == 2.0
    assert any(r["actor/grad_norm"] > 0 for r in rows)  # (a group whose 4 scores agree has no gradient)

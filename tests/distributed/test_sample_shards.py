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
    dc.close_states(one["state"], two["state"], atol=1e-6)

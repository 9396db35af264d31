"""DAPO dynamic sampling helpers and the limit error, on hand-made batches."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

from rlforge.batch import Batch
from rlforge.trainer.dynamic_sampling import kept_groups, select_groups, sequence_metric


def test_kept_groups_drops_zero_spread_and_keeps_singletons():
    uids = np.array(["a", "a", "b", "b", "c", "d", "d"], dtype=object)
    values = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.5, 0.25])
    assert kept_groups(uids, values) == ["a", "c", "d"]


def test_select_groups_and_metric():
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0], [2.0, 0.0], [2.0, 0.0]])
    b = Batch.from_dict({"token_level_scores": scores}, {"uid": ["x", "x", "y", "y"]})
    vals = sequence_metric(b, "seq_reward")
    assert vals.tolist() == [1.0, 0.0, 2.0, 2.0]
    assert kept_groups(b.non_tensor["uid"], vals) == ["x"]
    sel = select_groups(b, ["x"])
    assert sel.non_tensor["uid"].tolist() == ["x", "x"]
    assert torch.equal(sel["token_level_scores"], scores[:2])


@pytest.mark.e2e
def test_generation_limit_is_one_clear_error(tmp_path):
    # preset:tiny never answers the arithmetic task correctly: every group has zero spread.
    cmd = [
        sys.executable, "-m", "rlforge.cli", "train", "actor_rollout_ref.model.path=preset:tiny",
        "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "data.max_response_length=2", "data.builtin.train_size=8", "trainer.val_before_train=false",
        "trainer.total_training_steps=1", "trainer.logger=[file]", f"trainer.default_local_dir={tmp_path}",
        "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=2",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, env={"OMP_NUM_THREADS": "1", "PATH": ""}, timeout=300)
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert "algorithm.filter_groups.max_num_gen_batches=2" in res.stderr
    assert "kept 0 of 2 prompt groups" in res.stderr

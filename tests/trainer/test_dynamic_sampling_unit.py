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


# ---------------------------------------------------------------------------------------------- data.gen_batch_size


class _GenLoader:
    """Hands out the prompts ``p0, p1, ...`` in batches of ``size`` (the training loader)."""

    def __init__(self, size: int) -> None:
        self.size, self.next_id, self.batches = size, 0, 0

    def next_batch(self) -> list[str]:
        ids = [f"p{self.next_id + i}" for i in range(self.size)]
        self.next_id += self.size
        self.batches += 1
        return ids


def _collect_with(overrides: list[str], scores: dict[str, tuple[float, float]]):
    """``PPOTrainer._collect`` with a loader of ``generation_batch_size(cfg)`` prompts and a generate-and-score
    stage that gives each prompt's two responses the sequence scores in ``scores``."""
    from types import SimpleNamespace

    from rlforge.config import load_config
    from rlforge.config.data import generation_batch_size
    from rlforge.trainer.ppo_trainer import PPOTrainer

    cfg = load_config(["algorithm.filter_groups.enable=true", "actor_rollout_ref.rollout.n=2", *overrides])
    loader = _GenLoader(generation_batch_size(cfg))
    trainer = object.__new__(PPOTrainer)
    trainer.cfg, trainer.world_size, trainer.job = cfg, 1, SimpleNamespace(train_loader=loader)

    def generate_and_score(m):
        prompts = loader.next_batch()
        uids = [p for p in prompts for _ in range(2)]
        rows = [[scores[p][i], 0.0] for p in prompts for i in range(2)]
        return Batch.from_dict({"token_level_scores": torch.tensor(rows)}, {"uid": uids})

    trainer._generate_and_score = generate_and_score
    m: dict[str, float] = {}
    batch = trainer._collect(m)
    return batch, m, loader


def test_gen_batch_size_draws_generation_batches_until_train_batch_size_groups_survive():
    """Hand-checked: train_batch_size=4 groups, gen_batch_size=3 prompts per generation batch, n=2.
    batch 1: p0 (1,0) kept, p1 (1,1) and p2 (0,0) zero spread -> 1 kept, 2 dropped;
    batch 2: p3 (0,1), p4 (1,0) kept, p5 (0,0) dropped -> 3 kept, 1 dropped;
    batch 3: p6 (1,1) dropped, p7 (1,0) kept -> 4 kept: p8 (0,1) qualifies but is one too many (verl keeps
    the first train_batch_size groups) -> 2 dropped.  Training batch: p0 p3 p4 p7, 8 responses."""
    scores = {"p0": (1, 0), "p1": (1, 1), "p2": (0, 0), "p3": (0, 1), "p4": (1, 0), "p5": (0, 0),
              "p6": (1, 1), "p7": (1, 0), "p8": (0, 1)}
    batch, m, loader = _collect_with(["data.train_batch_size=4", "data.gen_batch_size=3"], scores)
    assert loader.size == 3 and loader.batches == 3
    assert batch.non_tensor["uid"].tolist() == ["p0", "p0", "p3", "p3", "p4", "p4", "p7", "p7"]
    assert batch["token_level_scores"][:, 0].tolist() == [1, 0, 0, 1, 1, 0, 1, 0]
    assert m == {"train/num_gen_batches": 3.0, "filter_groups/kept": 4.0, "filter_groups/dropped": 5.0}


def test_gen_batch_size_larger_than_train_batch_size_needs_one_generation_batch():
    """gen_batch_size=6 > train_batch_size=2 (DAPO's usual 3x): one batch of 6 prompts; p0 dropped, p1 and p2 kept."""
    scores = {f"p{i}": (0, 0) if i == 0 else (float(i), 0.0) for i in range(6)}
    batch, m, loader = _collect_with(["data.train_batch_size=2", "data.gen_batch_size=6"], scores)
    assert loader.batches == 1 and loader.size == 6
    assert batch.non_tensor["uid"].tolist() == ["p1", "p1", "p2", "p2"]
    assert m["filter_groups/dropped"] == 4.0


def test_gen_batch_size_without_dynamic_sampling_warns_and_loader_keeps_train_batch_size():
    from rlforge.config import load_config
    from rlforge.config.data import generation_batch_size
    from rlforge.config.later_work import later_work_warnings

    cfg = load_config(["data.train_batch_size=4", "data.gen_batch_size=12"])
    assert generation_batch_size(cfg) == 4
    hits = [w for w in later_work_warnings(cfg) if w.startswith("data.gen_batch_size=12")]
    assert len(hits) == 1 and "algorithm.filter_groups.enable=true" in hits[0], hits
    on = load_config(["data.train_batch_size=4", "data.gen_batch_size=12", "algorithm.filter_groups.enable=true"])
    assert generation_batch_size(on) == 12
    assert not [w for w in later_work_warnings(on) if "gen_batch_size" in w]


def test_gen_batch_size_not_divisible_by_ranks_is_one_line():
    from rlforge.config import load_config, validate_config
    from rlforge.errors import ConfigError

    cfg = load_config(["data.train_batch_size=4", "data.gen_batch_size=3", "algorithm.filter_groups.enable=true",
                       "trainer.n_gpus_per_node=2", "trainer.device=cuda", "actor_rollout_ref.actor.ppo_mini_batch_size=2"])
    with pytest.raises(ConfigError, match=r"data.gen_batch_size=3 must be positive and divisible by the 2 ranks"):
        validate_config(cfg)

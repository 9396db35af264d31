"""Per-rank batch sizes from verl's keys (rlforge.trainer.builders.sizes.per_step_sizes), by hand."""

from __future__ import annotations

from rlforge.config import load_config
from rlforge.trainer.builders.sizes import per_step_sizes

A = "actor_rollout_ref"


def test_deprecated_global_micro_batch_keys_are_divided_by_the_ranks_as_in_verl():
    cfg = load_config(["data.train_batch_size=16", f"{A}.rollout.n=4", f"{A}.actor.ppo_mini_batch_size=8",
                       f"{A}.actor.ppo_micro_batch_size=16", f"{A}.rollout.log_prob_micro_batch_size=8",
                       f"{A}.ref.log_prob_micro_batch_size=2"])
    one, four = per_step_sizes(cfg, 1), per_step_sizes(cfg, 4)
    assert (one["actor_mini"], one["actor_micro"], one["log_prob_micro"], one["ref_micro"]) == (32, 16, 8, 2)
    # 4 ranks: mini 8 x 4 / 4 = 8 sequences; the global micro sizes / 4 (at least 1)
    assert (four["actor_mini"], four["actor_micro"], four["log_prob_micro"], four["ref_micro"]) == (8, 4, 2, 1)


def test_per_gpu_keys_are_per_gpu():
    cfg = load_config(["data.train_batch_size=16", f"{A}.rollout.n=4", f"{A}.actor.ppo_mini_batch_size=8",
                       f"{A}.actor.ppo_micro_batch_size_per_gpu=4"])
    assert per_step_sizes(cfg, 4)["actor_micro"] == 4

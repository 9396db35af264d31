"""The layouts of a step's batch over the ranks and their size checks (:mod:`rlforge.config.sharding`);
config layer only, no processes."""

from __future__ import annotations

import pytest

from rlforge.config import load_config, validate_config
from rlforge.config.sharding import BatchLayout, batch_layout, sample_indices
from rlforge.errors import ConfigError

ARR = "actor_rollout_ref"
MEG = f"{ARR}.actor.megatron"


def _check(*overrides: str) -> list[str]:
    return validate_config(load_config(["algorithm.adv_estimator=grpo", *overrides]))


@pytest.fixture(autouse=True)
def _no_launcher(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)


def test_layout_is_picked_from_the_sizes():
    assert BatchLayout(num_prompts=4, n=8, world=2, dp=2).mode == "prompts"
    assert BatchLayout(num_prompts=3, n=8, world=1, dp=1).mode == "prompts"
    assert BatchLayout(num_prompts=1, n=4, world=2, dp=2).mode == "samples"
    assert BatchLayout(num_prompts=3, n=8, world=48, dp=8, pp=6).mode == "replica_samples"


def test_sample_indices_by_hand():
    # samples: contiguous equal shares of the 4 samples of one prompt
    lay = BatchLayout(num_prompts=1, n=4, world=2, dp=2)
    assert [sample_indices(lay, r) for r in range(2)] == [[0, 1], [2, 3]]
    # verl's router_replay example: 24 samples, dp=8 replicas of pp=6 ranks; replica d = ranks d, d+8, ..
    lay = BatchLayout(num_prompts=3, n=8, world=48, dp=8, pp=6)
    shares = {r: sample_indices(lay, r) for r in range(48)}
    assert [shares[r] for r in (0, 8, 16, 24, 32, 40)] == [[], [0], [], [1], [], [2]]
    assert [shares[r] for r in (7, 15, 23, 31, 39, 47)] == [[], [21], [], [22], [], [23]]
    assert sorted(i for s in shares.values() for i in s) == list(range(24))  # each sample once
    assert BatchLayout(num_prompts=2, n=4, world=2, dp=1, tp=2).mode == "prompts"  # whole prompts, unchanged


def test_replica_layout_keeps_every_mini_batch_whole_on_each_replica():
    lay = BatchLayout(num_prompts=2, n=3, world=4, dp=1, pp=4, num_mini_batches=2)  # 6 samples, 4 ranks
    assert lay.mode == "replica_samples"
    shares = [sample_indices(lay, r) for r in range(4)]
    # mini-batch 0 = samples 0..2 over 4 ranks (0,1,1,1 per rank by m*i//g), mini-batch 1 = 3..5 alike
    assert shares == [[], [0, 3], [1, 4], [2, 5]]


def test_the_router_replay_sizes_are_accepted():
    warnings = _check("data.train_batch_size=3", f"{ARR}.rollout.n=8", f"{ARR}.actor.ppo_mini_batch_size=3",
                      f"{ARR}.actor.strategy=megatron", f"{MEG}.pipeline_model_parallel_size=6",
                      "trainer.nnodes=6", "trainer.n_gpus_per_node=8", "trainer.balance_batch=false")
    assert not [w for w in warnings if "share" in w]
    cfg = load_config(["data.train_batch_size=3", f"{ARR}.rollout.n=8", f"{ARR}.actor.strategy=megatron",
                       f"{ARR}.actor.ppo_mini_batch_size=3", f"{MEG}.pipeline_model_parallel_size=6"])
    assert batch_layout(cfg, 48).dp == 8


def test_balance_batch_warns_under_the_uneven_layout():
    warnings = _check("data.train_batch_size=1", f"{ARR}.rollout.n=1", f"{ARR}.actor.ppo_mini_batch_size=1",
                      f"{ARR}.actor.strategy=megatron", f"{MEG}.pipeline_model_parallel_size=2",
                      "trainer.n_gpus_per_node=2")
    assert any(w.startswith("trainer.balance_batch=True:") and "not balanced" in w for w in warnings)


@pytest.mark.parametrize(("overrides", "start", "names"), [
    # samples do not divide over FSDP's ranks
    (["data.train_batch_size=3", f"{ARR}.rollout.n=1", f"{ARR}.actor.ppo_mini_batch_size=3",
      "trainer.n_gpus_per_node=2"], "data.train_batch_size=3 is not divisible by the 2 ranks",
     ["3 samples", "not divisible by the 2 ranks"]),
    # megatron: the data-parallel size counts, 3 x 1 samples over dp=2
    (["data.train_batch_size=3", f"{ARR}.rollout.n=1", f"{ARR}.actor.ppo_mini_batch_size=3",
      f"{ARR}.actor.strategy=megatron", f"{MEG}.pipeline_model_parallel_size=2", "trainer.n_gpus_per_node=4"],
     "data.train_batch_size=3 is not divisible by the 4 ranks", ["2 data-parallel replicas"]),
    # mini-batches counted in samples
    (["data.train_batch_size=2", f"{ARR}.rollout.n=2", f"{ARR}.actor.ppo_mini_batch_size=1",
      "trainer.n_gpus_per_node=4"], "data.train_batch_size=2", ["ppo_mini_batch_size x", "1 x 2 = 2 samples"]),
    # DAPO's dynamic sampling needs whole groups per rank
    (["data.train_batch_size=1", f"{ARR}.rollout.n=2", f"{ARR}.actor.ppo_mini_batch_size=1",
      "trainer.n_gpus_per_node=2", "algorithm.filter_groups.enable=true"],
     "algorithm.filter_groups.enable=True", ["whole prompt groups"]),
    # the uneven layout needs megatron for every role
    (["data.train_batch_size=1", f"{ARR}.rollout.n=1", f"{ARR}.actor.ppo_mini_batch_size=1",
      f"{ARR}.actor.strategy=megatron", f"{MEG}.pipeline_model_parallel_size=2", "trainer.n_gpus_per_node=2",
      "algorithm.adv_estimator=gae", "critic.strategy=fsdp2"],
     "data.train_batch_size=1", ["critic.strategy=fsdp2", "only strategy=megatron"]),
])
def test_refusals_are_one_line_naming_the_keys(overrides, start, names):
    with pytest.raises(ConfigError) as e:
        _check(*overrides)
    msg = str(e.value)
    assert msg.startswith(start) and "\n" not in msg, msg
    for name in names:
        assert name in msg, msg


@pytest.mark.parametrize(("bs", "mini"), [(6, 3), (2, 1)])
def test_whole_prompts_whose_mini_batch_samples_do_not_split_over_the_ranks_are_one_line(bs, mini):
    """2 ranks, n=1: 3 (or 1) samples per mini-batch would floor to 1 (or 0) per rank."""
    from rlforge.config import load_config, validate_config
    from rlforge.errors import ConfigError

    a = "actor_rollout_ref"
    cfg = load_config(["trainer.n_gpus_per_node=2", f"data.train_batch_size={bs}", f"{a}.actor.ppo_mini_batch_size={mini}",
                       f"{a}.rollout.n=1", f"{a}.actor.ppo_micro_batch_size_per_gpu=1",
                       "algorithm.adv_estimator=reinforce_plus_plus"])
    with pytest.raises(ConfigError, match=rf"^{a}\.actor\.ppo_mini_batch_size x {a}\.rollout\.n = {mini} x 1"):
        validate_config(cfg)

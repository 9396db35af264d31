"""The world size under a launcher: ``WORLD_SIZE`` wins over ``trainer.nnodes x
trainer.n_gpus_per_node`` unless those were set and disagree (config layer only, no processes)."""

from __future__ import annotations

import pytest

from rlforge.config import load_config, validate_config
from rlforge.config.world import run_world
from rlforge.errors import ConfigError

MEG = "actor_rollout_ref.actor.megatron"
TP2_PP2 = ["actor_rollout_ref.actor.strategy=megatron", f"{MEG}.tensor_model_parallel_size=2",
           f"{MEG}.pipeline_model_parallel_size=2", "data.train_batch_size=8",
           "actor_rollout_ref.actor.ppo_mini_batch_size=4"]


def test_without_a_launcher_the_config_counts(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert run_world(load_config(["trainer.n_gpus_per_node=4", "trainer.nnodes=2"])).size == 8
    assert run_world(load_config([])).size == 1


def test_the_launchers_world_size_is_used_when_the_config_keeps_its_default(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    world = run_world(load_config([]))
    assert (world.size, world.source) == (4, "WORLD_SIZE from the launcher")
    validate_config(load_config(TP2_PP2))  # TP x PP = 4 fits the launcher's 4 processes


def test_an_explicit_world_that_agrees_is_accepted(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    assert run_world(load_config(["trainer.n_gpus_per_node=4", "trainer.nnodes=2"])).size == 8
    assert run_world(load_config(["trainer.n_gpus_per_node=8"])).size == 8


def test_an_explicit_world_that_disagrees_names_both_numbers_and_the_key(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError) as e:
        validate_config(load_config(["trainer.n_gpus_per_node=3"]))
    msg = str(e.value)
    assert "= 1 x 3 = 3" in msg and "WORLD_SIZE=2" in msg and "set trainer.n_gpus_per_node=2" in msg
    monkeypatch.setenv("WORLD_SIZE", "6")
    with pytest.raises(ConfigError, match=r"= 4 x 2 = 8.*WORLD_SIZE=6.*so that their product is 6"):
        run_world(load_config(["trainer.nnodes=4", "trainer.n_gpus_per_node=2"]))
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=6.*set trainer.n_gpus_per_node=3"):
        run_world(load_config(["trainer.nnodes=2", "trainer.n_gpus_per_node=2"]))


def test_megatron_sizes_are_checked_against_the_launchers_world(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"= 4 does not divide the world size 2 \(WORLD_SIZE from the launcher\)"):
        validate_config(load_config(TP2_PP2))
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="data.train_batch_size=6 is not divisible by the 4 ranks .WORLD_SIZE"):
        validate_config(load_config(["data.train_batch_size=6", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]))


def test_a_malformed_world_size_is_one_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(ConfigError, match="WORLD_SIZE='four' is not a process count"):
        run_world(load_config([]))


@pytest.mark.parametrize("rank", [0, 1])
def test_a_user_error_under_a_launcher_is_printed_by_rank_0(monkeypatch, capsys, rank):
    import rlforge.launch
    from rlforge.launch import report_user_error

    monkeypatch.setattr(rlforge.launch, "_leave_process_group", lambda: None)  # keep this process's group
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(rank))
    report_user_error("bad key", wait_s=0.0)
    err = capsys.readouterr().err
    # rank 0 at once; another rank only after the wait (the launcher normally stops it first)
    assert err == ("rlforge: error: bad key\n" if rank == 0 else "rlforge: error: (rank 1) bad key\n")


def test_nnodes_that_disagree_with_the_nodes_torchrun_joined_name_both(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "6")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "3")  # torchrun: 3 launchers of 2 ranks met
    with pytest.raises(ConfigError, match=r"trainer.nnodes=2, but torchrun's rendezvous joined 3 node\(s\) "
                       r"\(GROUP_WORLD_SIZE=3\); start every node with the same --nnodes and trainer.nnodes"):
        run_world(load_config(["trainer.nnodes=2"]))
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert run_world(load_config(["trainer.nnodes=2", "trainer.n_gpus_per_node=2"])).size == 4
    assert run_world(load_config([])).size == 4  # trainer.nnodes unset: the launcher's shape


@pytest.mark.parametrize(("env", "expected"), [("", 0), ("0", 1), ("0,1,2,3", 4), ("0,1,-1,3", 2), ("GPU-ab,GPU-cd", 2)])
def test_visible_gpus_follows_cuda_visible_devices(monkeypatch, env, expected):
    from rlforge.config.world import visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
    assert visible_gpus() == expected


def test_verl_defaults_take_the_nodes_gpus_where_n_gpus_per_node_is_unset(monkeypatch):
    """verl's n_gpus_per_node=8 means a node's GPUs: under verl's defaults (job None) an unset key becomes the
    visible count; a user's value, rlforge's own jobs, a launcher and trainer.device=cpu keep theirs."""
    from rlforge.config import load_config

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    assert load_config([]).trainer.n_gpus_per_node == 4
    assert load_config(["trainer.n_gpus_per_node=2"]).trainer.n_gpus_per_node == 2
    assert load_config([], job="default").trainer.n_gpus_per_node == 1
    assert load_config(["trainer.device=cpu"]).trainer.n_gpus_per_node == 1
    assert load_config(["trainer.device=cuda:1"]).trainer.n_gpus_per_node == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert load_config([]).trainer.n_gpus_per_node == 1
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert load_config([]).trainer.n_gpus_per_node == 1


def test_a_node_whose_count_matches_still_stops_when_another_nodes_differs(monkeypatch):
    """The race of two launchers with --nnodes 2 and 3: the 2-node rendezvous closes with both.  The node
    of trainer.nnodes=2 sees GROUP_WORLD_SIZE=2 (its own count) and must still stop, from the other rank's
    value in torchrun's store, rather than wait for that rank in the process group."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    import rlforge.config.world as world

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10))
    dist.PrefixStore("rlforge/nnodes/attempt_0/", store).set("1", "3")  # rank 1, the other node: trainer.nnodes=3
    monkeypatch.setattr(world, "_DECLARED", {})
    for key, value in {"TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "RANK": "0", "WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError, match=r"trainer.nnodes differs between the nodes torchrun's rendezvous joined "
                       r"\(2 node\(s\), GROUP_WORLD_SIZE=2\): trainer.nnodes=2 on rank\(s\) 0; trainer.nnodes=3 on "
                       r"rank\(s\) 1; start every node"):
        run_world(load_config(["trainer.nnodes=2"]))
    # the same ranks agreeing: the world is the launcher's
    monkeypatch.setattr(world, "_DECLARED", {})
    dist.PrefixStore("rlforge/nnodes/attempt_0/", store).set("1", "2")
    assert run_world(load_config(["trainer.nnodes=2"])).size == 2

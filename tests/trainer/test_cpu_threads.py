"""On a CPU run rlforge sets torch's threads from the cores the process may use (its CPU affinity,
shared among the node's processes) unless the user set ``OMP_NUM_THREADS``, and the start line says
how many."""

from __future__ import annotations

import os

import pytest
import torch

from rlforge.config import load_config
from rlforge.trainer import cpu_threads
from rlforge.trainer.cpu_threads import CpuThreads, apply_cpu_threads, pick_cpu_threads, usable_cores
from rlforge.trainer.summary import announce_start, launching, start_line


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _cfg(tmp_path, *extra):
    return load_config(["actor_rollout_ref.model.path=preset:tiny", "data.train_files=a.parquet",
                        "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path}", *extra], job=None)


def test_pick_cpu_threads():
    assert pick_cpu_threads({}, 8, 1) == CpuThreads(8, False)
    assert pick_cpu_threads({}, 8, 3) == CpuThreads(2, False)  # 8 cores // 3 processes
    assert pick_cpu_threads({}, 2, 4) == CpuThreads(1, False)  # at least one
    assert pick_cpu_threads({"OMP_NUM_THREADS": "3"}, 8, 1) == CpuThreads(3, True)  # the user's choice
    assert pick_cpu_threads({"OMP_NUM_THREADS": " "}, 4, 1) == CpuThreads(4, False)  # not a number: ours
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_cpu_run_sets_torch_threads_from_the_affinity(tmp_path, monkeypatch, torch_threads):
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda pid: {0, 1, 2})
    torch.set_num_threads(1)
    cfg = _cfg(tmp_path, "trainer.device=cpu")
    assert apply_cpu_threads(cfg, env={}) == CpuThreads(3, False) and torch.get_num_threads() == 3
    torch.set_num_threads(1)
    assert apply_cpu_threads(cfg, env={"OMP_NUM_THREADS": "2"}) == CpuThreads(2, True)
    assert torch.get_num_threads() == 1  # the user's OMP_NUM_THREADS: torch read it itself; left alone


def test_start_line_says_how_many_threads(tmp_path, monkeypatch, capsys, torch_threads):
    cfg = _cfg(tmp_path, "trainer.device=cpu")
    head = "rlforge train: start | model preset:tiny | task a.parquet | algorithm gae | 2 steps | device cpu"
    assert start_line(cfg, "cpu", CpuThreads(3, False)) == f"{head} (3 threads) | output {tmp_path}"
    assert start_line(cfg, "cpu", CpuThreads(1, True)) == f"{head} (1 thread, OMP_NUM_THREADS) | output {tmp_path}"
    two = _cfg(tmp_path, "trainer.device=cpu", "trainer.n_gpus_per_node=2")
    assert "device cpu x 2 processes (2 threads each) |" in start_line(two, "cpu", CpuThreads(2, False))

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda pid: {5, 7})
    announce_start(cfg, 0.0, apply_cpu_threads(cfg))
    assert capsys.readouterr().out == f"{head} (2 threads) | output {tmp_path}\n"
    with launching(0.0, CpuThreads(2, False)):  # launched workers inherit the choice
        assert os.environ["OMP_NUM_THREADS"] == "2"
    assert "OMP_NUM_THREADS" not in os.environ

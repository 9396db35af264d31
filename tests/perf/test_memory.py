"""Per-stage memory metrics (``StageMemory``) against a scripted CUDA allocator: each stage
reports its own peak and what it leaves allocated, and the step peak is the largest of all
stages although each stage restarts the allocator's peak counter."""

from __future__ import annotations

import pytest
import torch

from rlforge.perf import memory


class FakeAllocator:
    def __init__(self) -> None:
        self.allocated = 0
        self.peak = 0

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def free(self, n: int) -> None:
        self.allocated -= n

    def reset(self) -> None:
        self.peak = self.allocated


@pytest.fixture
def fake(monkeypatch):
    a = FakeAllocator()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *_: a.peak)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *_: a.peak + 10**9)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *_: a.allocated)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *_: a.reset())
    return a


def test_stage_peaks_and_step_peak(fake):
    sm, m = memory.StageMemory(), {}
    with sm.track("gen", m):
        fake.alloc(30 * 10**9)  # weights + KV cache
        fake.free(10 * 10**9)  # the cache is freed at the end
    with sm.track("update_actor", m):
        fake.alloc(50 * 10**9)
        fake.free(45 * 10**9)
    assert m["perf/max_memory_allocated_gb/gen"] == pytest.approx(30.0)
    assert m["perf/memory_allocated_gb/gen"] == pytest.approx(20.0)
    assert m["perf/max_memory_allocated_gb/update_actor"] == pytest.approx(70.0)
    assert m["perf/memory_allocated_gb/update_actor"] == pytest.approx(25.0)
    step = memory.memory_metrics(stages=sm)
    assert step["perf/max_memory_allocated_gb"] == pytest.approx(70.0)
    assert step["perf/max_memory_reserved_gb"] == pytest.approx(71.0)
    # the next step starts from what is allocated now, not from the last step's peak
    with sm.track("gen", m):
        fake.alloc(1)
    assert memory.memory_metrics(stages=sm)["perf/max_memory_allocated_gb"] == pytest.approx(25.0, abs=1e-6)


def test_no_cuda_no_stage_metrics(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    m: dict[str, float] = {}
    with memory.StageMemory().track("gen", m):
        pass
    assert m == {}

"""Memory metrics: ``perf/max_memory_allocated_gb``, ``perf/max_memory_reserved_gb`` (CUDA
caching allocator peaks over the step) and ``perf/cpu_memory_used_gb`` (resident set size of
this process); per stage (:class:`StageMemory`): ``perf/max_memory_allocated_gb/<stage>`` (the
stage's own peak) and ``perf/memory_allocated_gb/<stage>`` (what stays allocated when the stage
ends, e.g. what the trainer keeps resident while the rollout is awake).  Gigabytes are 1e9 bytes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def _rss_bytes() -> float:
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return float(pages * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        import resource

        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0


def memory_metrics(reset: bool = True, stages: StageMemory | None = None) -> dict[str, float]:
    """Current memory metrics; ``reset`` restarts the CUDA peak counters for the next step.
    ``stages``: the step's :class:`StageMemory`, whose per-stage resets the step peaks include."""
    m = {"perf/cpu_memory_used_gb": _rss_bytes() / 1e9}
    if torch.cuda.is_available():
        alloc, reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        if stages is not None:
            alloc, reserved = max(alloc, stages.peak_allocated), max(reserved, stages.peak_reserved)
            if reset:
                stages.peak_allocated = stages.peak_reserved = 0
        m["perf/max_memory_allocated_gb"] = alloc / 1e9
        m["perf/max_memory_reserved_gb"] = reserved / 1e9
        if reset:
            torch.cuda.reset_peak_memory_stats()
    return m


class StageMemory:
    """Per-stage CUDA memory of one rank (see the module docstring); a no-op without CUDA.

    :meth:`track` restarts the allocator's peak counters at the stage start, so it keeps the
    step's running peaks (``peak_allocated``/``peak_reserved``, bytes) for :func:`memory_metrics`."""

    def __init__(self) -> None:
        self.peak_allocated = 0
        self.peak_reserved = 0

    def _fold(self) -> None:
        self.peak_allocated = max(self.peak_allocated, torch.cuda.max_memory_allocated())
        self.peak_reserved = max(self.peak_reserved, torch.cuda.max_memory_reserved())

    @contextmanager
    def track(self, name: str, m: dict[str, float]) -> Iterator[None]:
        """Context of stage ``name``: writes its two metrics into ``m`` when it ends (also on error)."""
        if not torch.cuda.is_available():
            yield
            return
        self._fold()
        torch.cuda.reset_peak_memory_stats()
        try:
            yield
        finally:
            self._fold()
            m[f"perf/max_memory_allocated_gb/{name}"] = torch.cuda.max_memory_allocated() / 1e9
            m[f"perf/memory_allocated_gb/{name}"] = torch.cuda.memory_allocated() / 1e9

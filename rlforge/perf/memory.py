"""Memory metrics: ``perf/max_memory_allocated_gb``, ``perf/max_memory_reserved_gb`` (CUDA
caching allocator peaks since the last reset) and ``perf/cpu_memory_used_gb`` (resident
set size of this process).  Gigabytes are 1e9 bytes."""

from __future__ import annotations

import os

import torch


def _rss_bytes() -> float:
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
        return float(pages * os.sysconf("SC_PAGE_SIZE"))
    except (OSError, ValueError, IndexError):
        import resource

        return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024.0


def memory_metrics(reset: bool = True) -> dict[str, float]:
    """Current memory metrics; ``reset`` restarts the CUDA peak counters for the next step."""
    m = {"perf/cpu_memory_used_gb": _rss_bytes() / 1e9}
    if torch.cuda.is_available():
        m["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 1e9
        m["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved() / 1e9
        if reset:
            torch.cuda.reset_peak_memory_stats()
    return m

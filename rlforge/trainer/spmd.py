"""SPMD helpers for the step loop: one process per device, the same code on every rank.

With no process group (one process) every function is the identity, so one code path
serves one CPU, one GPU and many GPUs (as nanochat does).  Each rank takes a contiguous
slice of every prompt batch, generates and scores its own responses (GRPO groups stay
whole on one rank), and the ranks meet in the engines' collectives and in the metric
reduction below.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.distributed as dist

from rlforge.batch import Batch


def world() -> tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def shard(batch: Batch) -> Batch:
    """This rank's contiguous slice of ``batch`` (its length must divide by the world size)."""
    rank, size = world()
    if size == 1:
        return batch
    per = len(batch) // size
    return batch.select(slice(rank * per, (rank + 1) * per))


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (a list of one element without a process group)."""
    _, size = world()
    if size == 1:
        return [obj]
    out: list[Any] = [None] * size
    dist.all_gather_object(out, obj)
    return out


def gather_batch(batch: Batch) -> Batch:
    """The concatenation of every rank's batch (CPU tensors), on every rank."""
    parts = gather_objects(batch.to("cpu"))
    return parts[0] if len(parts) == 1 else Batch.concat(parts)


def reduce_metrics(m: dict[str, float]) -> dict[str, float]:
    """Combine per-rank metrics: ``*/max`` and ``timing_s/*`` take the max, ``*/min`` the
    min, ``perf/total_num_tokens`` the sum, everything else the mean over ranks."""
    parts = gather_objects(m)
    if len(parts) == 1:
        return m
    keys = sorted({k for p in parts for k in p})
    out: dict[str, float] = {}
    for k in keys:
        vals = np.array([p[k] for p in parts if k in p], dtype=np.float64)
        if k.endswith("/max") or k.startswith("timing_s/") or k.startswith("perf/max_memory"):
            out[k] = float(vals.max())
        elif k.endswith("/min"):
            out[k] = float(vals.min())
        elif k == "perf/total_num_tokens":
            out[k] = float(vals.sum())
        else:
            out[k] = float(vals.mean())
    return out


def all_ranks(flag: bool) -> bool:
    """True when ``flag`` is true on every rank (a collective: every rank must call it)."""
    return all(gather_objects(bool(flag)))


def barrier() -> None:
    if world()[1] > 1:
        dist.barrier()

"""SPMD helpers for the step loop: one process per device, the same code on every rank.

With no process group (one process) every function is the identity, so one code path
serves one CPU, one GPU and many GPUs (as nanochat does).  Each rank takes its share of every
step's batch (whole prompts where the world divides ``data.train_batch_size``, else a share of the
prompt x ``n`` samples: :mod:`rlforge.trainer.sample_shards`), generates and scores its own
responses, and the ranks meet in the engines' collectives and in the metric reduction below.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch.distributed as dist
import torch.nn.functional as F

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


FULL_SEQUENCE_KEYS = ("input_ids", "attention_mask", "position_ids")
"""``(batch, prompt_len + response_len)`` tensors: left-padded prompt, right-padded response."""


def pad_to_widths(batch: Batch, prompt_len: int, response_len: int) -> Batch:
    """``batch`` with its prompt side left-padded to ``prompt_len`` and its response side
    right-padded to ``response_len`` (with 0: masked ids, mask 0, position 0).

    ``prompts`` is prompt-aligned, :data:`FULL_SEQUENCE_KEYS` span both, and every other 2-D
    tensor as wide as ``responses`` (masks, scores, log-probs, advantages) is response-aligned.
    Ranks generate responses as long as their own longest, so their batches differ in width
    until this pads them to common widths.
    """
    p = batch["prompts"].shape[1]
    r = batch["responses"].shape[1]
    dp, dr = prompt_len - p, response_len - r
    if dp == 0 and dr == 0:
        return batch
    out = {}
    for key, t in batch.tensors.items():
        if key == "prompts":
            out[key] = F.pad(t, (dp, 0))
        elif key in FULL_SEQUENCE_KEYS:
            out[key] = F.pad(t, (dp, dr))
        elif t.dim() == 2 and t.shape[1] == r:
            out[key] = F.pad(t, (0, dr))
        else:
            out[key] = t
    return Batch.from_dict(out, dict(batch.non_tensor), dict(batch.meta))


def gather_batch(batch: Batch) -> Batch:
    """The concatenation of every rank's batch (CPU tensors), on every rank; rollout batches of
    different widths are padded to the widest first (:func:`pad_to_widths`)."""
    parts = gather_objects(batch.to("cpu"))
    if len(parts) == 1:
        return parts[0]
    if all("prompts" in b and "responses" in b for b in parts):
        p = max(b["prompts"].shape[1] for b in parts)
        r = max(b["responses"].shape[1] for b in parts)
        parts = [pad_to_widths(b, p, r) for b in parts]
    return Batch.concat(parts)


SUMMED_METRICS = frozenset({"perf/total_num_tokens", "reward/timeouts", "reward/errors", "reward/judge_parse_failures"})
"""Per-rank counts whose run-wide value is the sum over ranks (each rank scores its own samples)."""


def reduce_metrics(m: dict[str, float]) -> dict[str, float]:
    """Combine per-rank metrics: ``*/max`` and ``timing_s/*`` take the max, ``*/min`` the
    min, the counts of :data:`SUMMED_METRICS` the sum, everything else the mean over ranks."""
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
        elif k in SUMMED_METRICS:
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

"""Gradients across tensor, pipeline and data parallelism: placement fix-up, tied copies, global norm.

* Replicated parameters used on sequence-sharded activations (sequence-parallel norms) get
  ``Partial`` DTensor gradients; :func:`finalize_grads` reduces them to the parameter's own
  placement before anything reads them.
* A tied embedding / LM head split over pipeline stages exists twice (first and last stage,
  as in Megatron-LM's "embedding group"); :func:`sync_tied_grads` sums the two gradients over
  the pipeline group so both copies take the same optimizer step and stay equal.
* :func:`global_grad_norm` is the L2 norm of the whole model's gradient, every element counted
  once: each rank sums the squares of its local shards divided by the number of ranks that
  hold the same shard, and one all-reduce over all ranks adds them up.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def finalize_grads(params: Iterable[torch.Tensor]) -> None:
    """Give every DTensor gradient its parameter's placements (``Partial`` → reduced)."""
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and isinstance(p, DTensor) and tuple(g.placements) != tuple(p.placements):
            p.grad = g.redistribute(p.device_mesh, p.placements)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def sync_tied_grads(param: torch.Tensor | None, shape: tuple[int, ...], dtype: torch.dtype, group: Any,
                    device: torch.device) -> None:
    """Sum the local gradient shards of the tied embedding and head copies over the pipeline
    ``group`` (ranks without a copy contribute zeros of ``shape``/``dtype``)."""
    if param is None:
        buf = torch.zeros(shape, dtype=dtype, device=device)
        dist.all_reduce(buf, group=group)
        return
    if param.grad is None:
        param.grad = torch.zeros_like(param)
    local = _local(param.grad)
    dist.all_reduce(local, group=group)


def _copies(t: torch.Tensor, stage_ranks: int) -> int:
    """How many ranks hold this rank's local data of ``t`` (among the ``stage_ranks`` ranks of
    this stage: the tensor- and data-parallel ranks)."""
    if not isinstance(t, DTensor):
        return stage_ranks
    mesh = t.device_mesh
    n = stage_ranks // mesh.size()
    for i, pl in enumerate(t.placements):
        if pl.is_replicate() or pl.is_partial():
            n *= mesh.size(i)
    return n


def global_grad_norm(params: Iterable[torch.Tensor], stage_ranks: int, device: torch.device) -> float:
    """L2 norm of all gradients of the model (a collective over all ranks).

    Args:
        params: this rank's parameters, each counted once (leave out duplicated tied copies).
        stage_ranks: ranks sharing one pipeline stage (``tp * dp``).
        device: where the reduction runs.
    """
    total = torch.zeros((), dtype=torch.float64, device=device)
    for p in params:
        if p.grad is None:
            continue
        local = _local(p.grad)
        total += local.double().pow(2).sum().to(device) / _copies(p.grad, stage_ranks)
    if dist.is_initialized():
        dist.all_reduce(total)
    return math.sqrt(float(total))


@torch.no_grad()
def clip_grads_(params: Iterable[torch.Tensor], total_norm: float, max_norm: float) -> None:
    """Scale all gradients by ``min(1, max_norm / (total_norm + 1e-6))`` (``clip_grad_norm_``'s rule)."""
    coef = min(1.0, max_norm / (total_norm + 1e-6))
    if coef < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(coef)

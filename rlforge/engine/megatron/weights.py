"""Full tensors out of TP/FSDP shards and PP stages, one at a time, and back into the shards.

Every rank iterates over the same list of entries (parameters, buffers or optimizer states,
in the Hugging Face model's order).  For each entry the ranks of the owning stage rebuild the
full tensor (``DTensor.full_tensor``: a collective over that stage's tensor- and data-parallel
ranks), and a broadcast over each pipeline group hands it to the other stages.  So every rank
ends with the full tensor and only one full tensor is alive at a time: peak memory is one
tensor, not one model (the rollout copy of each rank is refreshed this way every step).

Loading is local: every rank has the full state (each reads the checkpoint), and each
parameter keeps the slice its placements select (``distribute_tensor(..., src_data_rank=None)``
cuts the local shard without communication).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor


@dataclass(frozen=True)
class Entry:
    """One full tensor to gather: its ``name``, the pipeline index of its ``owner``, ``shape`` and ``dtype``."""

    name: str
    owner: int
    shape: tuple[int, ...]
    dtype: torch.dtype


def plan_entries(local: dict[str, torch.Tensor], order: list[str], pp_rank: int, pp_group: Any,
                 pp_size: int) -> list[Entry]:
    """The entries of ``order`` that some pipeline rank holds (a collective over ``pp_group``).

    Args:
        local: this rank's ``{name: tensor}`` (sharded tensors: the global shape counts).
        order: names in the wanted order; names no rank holds are dropped.
    """
    mine = {n: (tuple(t.shape), t.dtype) for n, t in local.items()}
    parts: list[Any] = [None] * pp_size
    if pp_size > 1:
        dist.all_gather_object(parts, (pp_rank, mine), group=pp_group)
    else:
        parts = [(pp_rank, mine)]
    owner: dict[str, tuple[int, tuple[int, ...], torch.dtype]] = {}
    for rank, names in sorted(parts, key=lambda x: x[0]):
        for n, (shape, dtype) in names.items():
            owner.setdefault(n, (rank, shape, dtype))
    return [Entry(n, *owner[n]) for n in order if n in owner]


def full_tensor(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A new tensor holding the unsharded ``t`` (a collective over ``t``'s mesh for a DTensor)."""
    if isinstance(t, DTensor):
        if t.device != device:  # FSDP CPU offload: shards on CPU, gather on the device
            t = t.to(device)
        local = t.to_local()
        full = t.full_tensor()
        same = full.untyped_storage().data_ptr() == local.untyped_storage().data_ptr()
        return full.detach().clone() if same else full.detach()  # a replicated DTensor is its local tensor
    return t.detach().to(device, copy=True)


def gather_entries(entries: list[Entry], local: Callable[[str], torch.Tensor], pp_rank: int, pp_ranks: list[int],
                   pp_group: Any, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, full tensor on device)`` for each entry, on every rank (collective).

    ``local(name)`` returns this rank's (possibly sharded) tensor of an entry it owns.
    """
    for e in entries:
        if e.owner == pp_rank:
            t = full_tensor(local(e.name), device).detach()
        else:
            t = torch.empty(e.shape, dtype=e.dtype, device=device)
        if len(pp_ranks) > 1:
            t = t.contiguous()
            dist.broadcast(t, src=pp_ranks[e.owner], group=pp_group)
        yield e.name, t


@torch.no_grad()
def load_full(dest: torch.Tensor, full: torch.Tensor, device: torch.device) -> None:
    """Copy this rank's slice of the full tensor ``full`` into ``dest`` (a DTensor or a plain
    tensor); ``device``: this rank's compute device (the DTensor mesh's)."""
    if isinstance(dest, DTensor):
        src = full.to(device=device, dtype=dest.dtype)
        shard = distribute_tensor(src, dest.device_mesh, dest.placements, src_data_rank=None).to_local()
        dest.to_local().copy_(shard)
    else:
        dest.copy_(full.to(device=dest.device, dtype=dest.dtype))

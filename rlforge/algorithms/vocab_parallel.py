"""Log-probs and entropy from vocabulary-parallel logits, without gathering the vocabulary.

Under tensor parallelism (``strategy=megatron``) the LM head is split column-wise: tensor-parallel
rank ``r`` of ``P`` holds the logits of vocabulary slice ``[start_r, start_r + V_r)`` as a
``DTensor`` with placement ``Shard(-1)``.  Gathering ``(batch, len, V)`` logits would cost ``P``
times the memory, so, as Megatron-LM's ``VocabParallelCrossEntropy`` (Shoeybi et al. 2019,
"Megatron-LM", section 3; ``megatron/core/tensor_parallel/cross_entropy.py``):

    m     = max_v z_v                    (all-reduce MAX over the tensor-parallel group)
    S     = sum_v exp(z_v - m)           (all-reduce SUM)
    lse   = m + log S
    z_y   = the label's logit            (owned by one rank; all-reduce SUM of the masked gather)
    log p_y = z_y - lse
    E[z]  = sum_v softmax(z)_v z_v       (all-reduce SUM)
    H     = lse - E[z]

Backward needs no communication (the incoming gradient is the same on every rank, as the loss
is): ``d log p_y / dz_v = 1[v = y] - p_v`` and ``dH / dz_v = p_v (E[z] - z_v)`` on the local
slice.  Everything is float32.  The results are plain ``(batch, len)`` tensors, identical on
every tensor-parallel rank.

Deviation from Megatron: the entropy is a separate autograd function (Megatron fuses only the
cross entropy); both recompute ``softmax`` in backward from the saved logits instead of saving it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard


def is_vocab_parallel(logits: torch.Tensor) -> bool:
    """True for a ``DTensor`` sharded on its last (vocabulary) dimension."""
    if not isinstance(logits, DTensor):
        return False
    return any(isinstance(p, Shard) and p.dim in (-1, logits.ndim - 1) for p in logits.placements)


def _local_and_group(logits: DTensor) -> tuple[torch.Tensor, Any, int]:
    """The local vocabulary slice (float32), the process group of its mesh dimension, and the
    slice's first vocabulary index (``torch.chunk`` layout, as DTensor's ``Shard``)."""
    if logits.device_mesh.ndim != 1 or len(logits.placements) != 1:
        raise ValueError("vocabulary-parallel logits must live on a 1-D tensor-parallel mesh")
    group = logits.device_mesh.get_group()
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    vocab = logits.shape[-1]
    chunk = -(-vocab // size)
    local = logits.to_local().float()
    start = min(rank * chunk, vocab)
    if local.shape[-1] != max(0, min(chunk, vocab - start)):
        raise ValueError(f"unexpected vocabulary shard width {local.shape[-1]} for vocab {vocab} over {size} ranks")
    return local, group, start


def _lse(z: torch.Tensor, group: Any) -> torch.Tensor:
    """Global log-sum-exp over the last dimension of the sharded ``z`` (no gradient)."""
    m = z.max(dim=-1).values if z.shape[-1] else torch.full(z.shape[:-1], -torch.inf, device=z.device)
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    s = torch.exp(z - m.unsqueeze(-1)).sum(dim=-1)
    dist.all_reduce(s, op=dist.ReduceOp.SUM, group=group)
    return m + torch.log(s)


class _VocabParallelLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, labels: torch.Tensor, start: int, group: Any) -> torch.Tensor:
        lse = _lse(z, group)
        local = labels - start
        owned = (local >= 0) & (local < z.shape[-1])
        idx = local.clamp(0, max(z.shape[-1] - 1, 0))
        picked = torch.gather(z, -1, idx.unsqueeze(-1)).squeeze(-1) if z.shape[-1] else torch.zeros_like(lse)
        picked = torch.where(owned, picked, torch.zeros_like(picked))
        dist.all_reduce(picked, op=dist.ReduceOp.SUM, group=group)
        ctx.save_for_backward(z, lse, idx, owned)
        return picked - lse

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        z, lse, idx, owned = ctx.saved_tensors
        g = -torch.exp(z - lse.unsqueeze(-1)) * grad.unsqueeze(-1)
        if z.shape[-1]:
            g.scatter_add_(-1, idx.unsqueeze(-1), (grad * owned).unsqueeze(-1))
        return g, None, None, None


class _VocabParallelEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, group: Any) -> torch.Tensor:
        lse = _lse(z, group)
        p = torch.exp(z - lse.unsqueeze(-1))
        ez = (p * z).sum(dim=-1)
        dist.all_reduce(ez, op=dist.ReduceOp.SUM, group=group)
        ctx.save_for_backward(z, lse, ez)
        return lse - ez

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        z, lse, ez = ctx.saved_tensors
        p = torch.exp(z - lse.unsqueeze(-1))
        return grad.unsqueeze(-1) * p * (ez.unsqueeze(-1) - z), None


def vocab_parallel_log_probs(logits: DTensor, labels: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[label]`` in float32 nats from vocabulary-sharded logits.

    Args:
        logits: ``(batch, len, V)`` DTensor, ``Shard(-1)`` on a 1-D tensor-parallel mesh.
        labels: ``(batch, len)`` global token ids (a plain tensor, the same on every rank).
    Returns:
        ``(batch, len)`` float32, the same on every rank of the mesh.
    """
    local, group, start = _local_and_group(logits)
    return _VocabParallelLogProb.apply(local, labels.to(local.device), start, group)


def vocab_parallel_entropy(logits: DTensor) -> torch.Tensor:
    """Entropy in nats, ``(batch, len)`` float32, of ``softmax(logits)`` from vocabulary-sharded
    ``(batch, len, V)`` logits (see :func:`vocab_parallel_log_probs`)."""
    local, group, _ = _local_and_group(logits)
    return _VocabParallelEntropy.apply(local, group)

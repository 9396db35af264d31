"""Data-parallel sequence-length balance (``trainer.balance_batch``).

Before the batch is split contiguously across data-parallel ranks, its rows are reordered
so that every rank gets the same number of rows and nearly the same number of valid
tokens (Karmarkar–Karp with equal part sizes, see :mod:`rlforge.engine.dynamic_batch`).
Without it one rank may hold all the long responses and the others wait for it.

``group_size`` keeps blocks of consecutive rows together (the ``rollout.n`` responses of
one prompt in GRPO), so per-group statistics can be computed on one rank.  verl balances
single rows; blocks are an addition.  KK is a heuristic and, with equal part sizes, can
(rarely) spread the totals more than the contiguous split; the contiguous split is then
kept, so balancing never makes the spread worse (another addition to verl).

Metrics follow verl's ``log_seqlen_unbalance`` (``verl/utils/seqlen_balancing.py``):
``min``/``max`` are the per-rank token totals of the naive contiguous split
(``len // world_size`` rows per rank), ``balanced_*`` those of the balanced parts, ``mean``
the total divided by the number of ranks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rlforge.engine.dynamic_batch import karmarkar_karp


def balance_across_ranks(seqlens: Sequence[int], world_size: int, group_size: int = 1) -> list[list[int]]:
    """Row indices for each data-parallel rank: equal row counts, near-equal token totals.

    Args:
        seqlens: ``(n,)`` valid tokens per row (``attention_mask.sum(-1)``).
        world_size: number of data-parallel ranks.
        group_size: rows ``[g * group_size, (g + 1) * group_size)`` always go to one rank.
    Returns:
        ``world_size`` ascending index lists of ``n // world_size`` rows each; rank ``r``
        gets list ``r``.  Use :func:`balanced_permutation` to reorder a batch so that the
        contiguous split hands each rank its list.
    Raises:
        ValueError: ``world_size < 1``, ``group_size < 1``, ``n`` not divisible by
            ``group_size``, or the number of groups not divisible by ``world_size``.
    """
    lens = [int(x) for x in seqlens]
    n = len(lens)
    if world_size < 1 or group_size < 1:
        raise ValueError(f"world_size and group_size must be >= 1, got {world_size} and {group_size}")
    if n % group_size != 0:
        raise ValueError(f"batch of {n} rows is not a whole number of groups of {group_size} (rollout.n)")
    num_groups = n // group_size
    if num_groups % world_size != 0:
        raise ValueError(
            f"{num_groups} groups of {group_size} rows cannot be split evenly over {world_size} ranks; "
            "make data.train_batch_size divisible by the data-parallel size"
        )
    block_lens = [sum(lens[g * group_size:(g + 1) * group_size]) for g in range(num_groups)]
    block_parts = karmarkar_karp(block_lens, world_size, equal_size=True)
    per_rank = num_groups // world_size
    contiguous = [list(range(r * per_rank, (r + 1) * per_rank)) for r in range(world_size)]
    if _spread(block_lens, contiguous) < _spread(block_lens, block_parts):
        block_parts = contiguous  # KK is a heuristic: never do worse than not balancing
    return [[g * group_size + j for g in part for j in range(group_size)] for part in block_parts]


def _spread(lens: Sequence[int], parts: Sequence[Sequence[int]]) -> int:
    sums = [sum(lens[i] for i in p) for p in parts]
    return max(sums) - min(sums)


def balanced_permutation(parts: Sequence[Sequence[int]]) -> torch.Tensor:
    """``(n,)`` int64 row order ``parts[0] + parts[1] + ...``: ``batch.select(perm)`` followed
    by a contiguous split gives rank ``r`` the rows ``parts[r]``."""
    return torch.tensor([i for p in parts for i in p], dtype=torch.long)


def seqlen_metrics(seqlens: Sequence[int], parts: Sequence[Sequence[int]]) -> dict[str, float]:
    """verl's ``global_seqlen/*`` metrics (tokens per rank before and after balancing).

    Args:
        seqlens: ``(n,)`` valid tokens per row.
        parts: the balanced rows of each rank (``len(parts)`` = number of ranks).
    Returns:
        ``global_seqlen/min``, ``/max``: smallest/largest per-rank total of the contiguous
        split into chunks of ``n // len(parts)`` rows; ``/minmax_diff``: their difference;
        ``/balanced_min``, ``/balanced_max``: smallest/largest total over ``parts``;
        ``/mean``: total tokens / number of ranks.
    Raises:
        ValueError: empty ``parts`` or fewer rows than ranks.
    """
    lens = [int(x) for x in seqlens]
    k = len(parts)
    if k == 0 or len(lens) < k:
        raise ValueError(
            f"need at least one part and at least as many rows as parts; got {len(lens)} rows, {k} parts"
        )
    chunk = len(lens) // k
    naive = [sum(lens[o:o + chunk]) for o in range(0, len(lens), chunk)]
    balanced = [sum(lens[i] for i in p) for p in parts]
    return {
        "global_seqlen/min": float(min(naive)),
        "global_seqlen/max": float(max(naive)),
        "global_seqlen/minmax_diff": float(max(naive) - min(naive)),
        "global_seqlen/balanced_min": float(min(balanced)),
        "global_seqlen/balanced_max": float(max(balanced)),
        "global_seqlen/mean": float(sum(lens) / k),
    }

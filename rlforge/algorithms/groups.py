"""Per-group statistics of sequence scores, for the group-baseline estimators and losses.

A *group* is the set of responses to one prompt: the rows of a batch that share an ``index``
entry (the prompt ``uid``).  Every helper here is vectorized with ``index_add_`` (no Python
loop over samples) and returns per-group tensors that the caller indexes with ``gid``.
"""

from __future__ import annotations

import numpy as np
import torch

from rlforge.errors import ConfigError


def group_ids(index: np.ndarray, device: torch.device) -> torch.Tensor:
    """Dense group ids (B,) long, 0..G-1, from any hashable ``index`` (B,) (e.g. uid strings)."""
    _, inverse = np.unique(np.asarray(index), return_inverse=True)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device)


def require_index(index: np.ndarray | None, name: str) -> np.ndarray:
    """``index`` or a ConfigError saying that estimator ``name`` needs the prompt uids."""
    if index is None:
        raise ConfigError(f"algorithm.adv_estimator={name!r} needs the prompt uid index of each response")
    return index


def group_sum(values: torch.Tensor, gid: torch.Tensor) -> torch.Tensor:
    """Sum of ``values`` (B,) per group: (G,)."""
    num_groups = int(gid.max()) + 1 if gid.numel() else 0
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, gid, values)


def group_count_mean_std(scores: torch.Tensor, gid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group size, mean and *unbiased* std (``torch.std``) of ``scores`` (B,).

    Returns:
        count (G,), mean (G,), std (G,) in the dtype of ``scores``.  A group of size 1 has
        std 0 here (Bessel's divisor clamped at 1); callers apply their own singleton rule.
    """
    count = group_sum(torch.ones_like(scores), gid)
    mean = group_sum(scores, gid) / count
    sq_dev = group_sum((scores - mean[gid]) ** 2, gid)
    std = (sq_dev / (count - 1).clamp_min(1.0)).sqrt()
    return count, mean, std


def grpo_normalized_scores(scores: torch.Tensor, gid: torch.Tensor, eps: float, norm_by_std: bool) -> torch.Tensor:
    """GRPO's per-sequence advantage (B,): ``(s - mean_g) / (std_g + eps)`` or ``s - mean_g``.

    A group of size 1 uses mean 0 and std 1, as verl does (so it yields ``s / (1 + eps)``).
    The statistics are computed in float64, so scores up to ~1e150 do not overflow.
    """
    dtype = scores.dtype
    scores = scores.double()
    count, mean, std = group_count_mean_std(scores, gid)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    adv = scores - mean[gid]
    if norm_by_std:
        adv = adv / (std[gid] + eps)
    return adv.to(dtype)

"""Masked reductions over ``(batch, response_len)`` tensors.

Semantics follow verl's ``verl.utils.torch_functional`` (``masked_mean``, ``masked_var``,
``masked_whiten``).  Deviation: the denominators are clamped at a tiny positive number
instead of adding ``1e-8``, so a mask of integer counts gives exact means and an all-zero
mask gives 0 instead of NaN.
"""

from __future__ import annotations

import torch

_TINY = 1e-8


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values * mask`` over ``dim`` (all elements when ``dim`` is None)."""
    prod = values * mask
    return prod.sum() if dim is None else prod.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions where ``mask`` is 1: ``sum(v*m) / sum(m)``.

    ``dim=None`` reduces everything to a scalar; ``dim=-1`` gives one mean per row.
    A row (or batch) with no valid position yields 0.
    """
    den = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(values, mask, dim) / den.clamp_min(_TINY)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over the valid positions (scalar).

    ``unbiased=True`` applies Bessel's correction ``n / (n - 1)`` with ``n = sum(mask)``,
    as verl does.

    Raises:
        ValueError: if ``unbiased`` and fewer than two positions are valid.
    """
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = float(mask.sum())
        if n < 2:
            raise ValueError(f"masked_var(unbiased=True) needs at least 2 valid positions, got {n:g}")
        var = var * (n / (n - 1.0))
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Whiten ``values`` with the masked mean and unbiased masked variance.

    ``(values - mean) / sqrt(var + 1e-8)``; with ``shift_mean=False`` the mean is added back.
    Values at masked positions are transformed too (callers mask them afterwards).
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened

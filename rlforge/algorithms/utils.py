"""Masked reductions over ``(batch, response_len)`` tensors.

Semantics follow verl's ``verl.utils.torch_functional`` (``masked_mean``, ``masked_var``,
``masked_whiten``).  Deviation: the denominators are clamped at a tiny positive number
instead of adding ``1e-8``, so a mask of integer counts gives exact means and an all-zero
mask gives 0 instead of NaN.  Masked positions are *selected* away (:func:`apply_mask`), not
multiplied by 0: a NaN or inf there (padding after the end of a response, a log-prob of -inf
at a token the sampler could not have drawn) does not reach the result or its gradient, as
``0 * nan = nan`` would.
"""

from __future__ import annotations

import torch

_TINY = 1e-8


def apply_mask(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values * mask`` where ``mask != 0`` and exactly 0 elsewhere, whatever ``values`` holds there.

    Args:
        values: any shape; masked positions may hold NaN or inf.
        mask: broadcastable to ``values``; bool, or numbers (0 = masked, other values weigh).

    Returns:
        ``values``' shape, with the dtype ``values * mask`` has.  The gradient with respect to
        ``values`` is 0 (not NaN) at masked positions.
    """
    keep = mask if mask.dtype == torch.bool else mask != 0
    return torch.where(keep, values * mask, 0.0)


def select_valid(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` where ``mask != 0``, exactly 0 elsewhere (not weighted by the mask).

    For the *inputs* of a per-token loss: a NaN or inf at a masked position would otherwise
    give a NaN gradient there (``0 * d/dx f(nan) = nan``) even though :func:`apply_mask` keeps
    it out of the loss value.  The gradient with respect to ``values`` is 0 at masked positions.
    Shapes as :func:`apply_mask`; the dtype is ``values``'.
    """
    keep = mask if mask.dtype == torch.bool else mask != 0
    return torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values * mask`` over ``dim`` (all elements when ``dim`` is None); masked
    positions count 0 even when ``values`` is NaN or inf there (:func:`apply_mask`)."""
    prod = apply_mask(values, mask)
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

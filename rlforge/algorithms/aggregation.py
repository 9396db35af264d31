"""Reduce a ``(batch, response_len)`` loss matrix to the scalar that is back-propagated.

Modes and names follow verl's ``agg_loss`` (``verl/trainer/ppo/core_algos.py``):

* ``token-mean``: every valid token of the mini-batch weighs the same (DAPO, Yu et al. 2025, eq. 8).
* ``token-sum``: the plain sum over every valid token of the mini-batch, no denominator (verl 0.9's
  ``agg_loss``; used by objectives written as sums, e.g. verl's DRO doc, ``docs/algo/dro.md``).
  The loss scale then grows with the number of tokens: lower the learning rate accordingly.
* ``seq-mean-token-sum``: sum over each sequence's tokens, mean over sequences.
* ``seq-mean-token-mean``: mean over each sequence's tokens, mean over sequences (GRPO,
  Shao et al. 2024, eq. 3).
* ``seq-mean-token-sum-norm``: sum over each sequence's tokens divided by a constant
  ``horizon``, mean over sequences (Dr. GRPO, Liu et al. 2025 "Understanding R1-Zero-Like
  Training", eq. 2 with ``MAX_TOKENS``).

Gradient accumulation.  When the engine splits a mini-batch into micro-batches it passes the
mini-batch totals ``global_num_tokens`` (valid tokens) and ``global_num_seqs`` (sequences with
at least one valid token, see :func:`loss_agg_globals`).  Each call then returns the
micro-batch's *share*: the sum over its rows divided by the global count.  The sum of the
micro-batch losses equals the loss of the whole mini-batch computed in one go, for every
mode, and so do the gradients.  Without the globals each call is a plain mean over its batch.
``token-sum`` needs no global count (a sum of sums is the sum); under data parallelism with
gradient averaging each rank's sum is multiplied by ``dp_size`` (the averaging group's size, as
verl does), so the averaged gradient is that of the sum over all ranks' tokens.

Deviations from verl:
* ``seq-mean-token-sum-norm`` divides by the number of sequences as the Dr. GRPO paper does;
  verl sums over sequences and divides only by ``loss_mask.shape[-1]``.
* Sequences without any valid token are not counted in the sequence denominator (verl's
  ``exclude_fully_masked_seq``), and for the modes with a denominator verl's ``* dp_size``
  factor is left to the engine: under data parallelism with gradient averaging, pass global
  counts divided by the world size (``token-sum``, which has no denominator, takes ``dp_size``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rlforge.registry import Registry

from .utils import masked_sum

AggFn = Callable[..., torch.Tensor]

LOSS_AGG_MODES: Registry[AggFn] = Registry(
    "loss aggregation mode", "actor_rollout_ref.actor.loss_agg_mode or critic.loss_agg_mode"
)


def num_valid_seqs(loss_mask: torch.Tensor) -> torch.Tensor:
    """Number of rows of ``loss_mask`` (B, R) with at least one valid token (0-dim float)."""
    return (loss_mask.sum(dim=-1) > 0).to(torch.float32).sum()


def loss_agg_globals(loss_mask: torch.Tensor) -> dict[str, float]:
    """Totals of a whole mini-batch, to pass to every micro-batch's :func:`agg_loss` call.

    Args:
        loss_mask: (B, R) mask of the entire mini-batch (before the micro-batch split).

    Returns:
        ``{"global_num_tokens": valid tokens, "global_num_seqs": sequences with a valid token}``.
    """
    return {
        "global_num_tokens": float(loss_mask.sum()),
        "global_num_seqs": float(num_valid_seqs(loss_mask)),
    }


def _den(global_value: float | None, local: torch.Tensor) -> torch.Tensor | float:
    if global_value is not None:
        if global_value <= 0:
            raise ValueError(f"global count must be > 0, got {global_value}")
        return float(global_value)
    return local.clamp_min(1.0)


@LOSS_AGG_MODES.register("token-mean")
def _token_mean(loss_mat, loss_mask, *, global_num_tokens, global_num_seqs, horizon, dp_size):
    return masked_sum(loss_mat, loss_mask) / _den(global_num_tokens, loss_mask.sum())


@LOSS_AGG_MODES.register("token-sum")
def _token_sum(loss_mat, loss_mask, *, global_num_tokens, global_num_seqs, horizon, dp_size):
    return masked_sum(loss_mat, loss_mask) * float(dp_size)


@LOSS_AGG_MODES.register("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat, loss_mask, *, global_num_tokens, global_num_seqs, horizon, dp_size):
    seq_losses = masked_sum(loss_mat, loss_mask, dim=-1)
    return seq_losses.sum() / _den(global_num_seqs, num_valid_seqs(loss_mask))


@LOSS_AGG_MODES.register("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat, loss_mask, *, global_num_tokens, global_num_seqs, horizon, dp_size):
    seq_losses = masked_sum(loss_mat, loss_mask, dim=-1) / loss_mask.sum(dim=-1).clamp_min(1.0)
    return seq_losses.sum() / _den(global_num_seqs, num_valid_seqs(loss_mask))


@LOSS_AGG_MODES.register("seq-mean-token-sum-norm")
def _seq_mean_token_sum_norm(loss_mat, loss_mask, *, global_num_tokens, global_num_seqs, horizon, dp_size):
    h = float(loss_mat.shape[-1]) if horizon is None else float(horizon)
    if h <= 0:
        raise ValueError(f"horizon must be > 0 tokens, got {h}")
    seq_losses = masked_sum(loss_mat, loss_mask, dim=-1) / h
    return seq_losses.sum() / _den(global_num_seqs, num_valid_seqs(loss_mask))


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    horizon: float | None = None,
    dp_size: int = 1,
) -> torch.Tensor:
    """Aggregate a per-token loss into a scalar.

    Args:
        loss_mat: (B, R) per-token loss.
        loss_mask: (B, R) 1 for tokens that count, 0 otherwise.
        loss_agg_mode: one of :data:`LOSS_AGG_MODES` (see the module docstring).
        global_num_tokens: valid tokens in the whole mini-batch (``token-mean``); None = this batch's.
        global_num_seqs: sequences with a valid token in the whole mini-batch (``seq-mean-*``);
            None = this batch's.
        horizon: constant token divisor of ``seq-mean-token-sum-norm``; None = ``loss_mat.shape[-1]``.
            Pass it (e.g. ``data.max_response_length``) when micro-batches are padded differently.
        dp_size: ranks whose gradients are averaged (``token-sum`` multiplies its sum by it); 1 alone.

    Returns:
        0-dim tensor: the loss, or this micro-batch's share of the mini-batch loss.

    Raises:
        ConfigError: for an unknown ``loss_agg_mode``; the message lists the valid modes.
    """
    fn = LOSS_AGG_MODES.get(loss_agg_mode)
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1 rank, got {dp_size}")
    return fn(
        loss_mat,
        loss_mask.to(loss_mat.dtype),
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        horizon=horizon,
        dp_size=dp_size,
    )

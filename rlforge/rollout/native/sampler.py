"""Greedy / temperature / top-k / top-p sampling of ``logits: [B, V]`` (any float dtype).

Order as in transformers' ``generate``: temperature, then top-k, then top-p (keeps the
smallest set of tokens whose probability reaches ``top_p``, always at least one).

A categorical draw is taken with the exponential race: ``argmax(p_i / E_i)`` with
``E_i ~ Exp(1)`` i.i.d. picks ``i`` with probability ``p_i`` exactly (computed in log space as
``argmax(logit_i - log E_i)``), and unlike ``torch.multinomial`` it needs no host
synchronisation.

Log-probs (``rollout.calculate_log_probs``) are those of the sampled token under
``softmax(logits / temperature)`` before top-k/top-p, in nats: the distribution the trainer's
``old_log_prob`` stage scores (greedy decoding uses temperature 1).
"""

from __future__ import annotations

import torch

from rlforge.errors import RLForgeError
from rlforge.rollout.base import SamplingParams

NON_FINITE = (
    "the policy produced non-finite logits: its weights hold NaN/inf (a diverged run: lower "
    "actor_rollout_ref.actor.optim.lr or grad_clip, or check the reward scale; before any update: the "
    "checkpoint at actor_rollout_ref.model.path), or actor_rollout_ref.rollout.temperature is so small that "
    "logits / temperature overflow (use 0 for greedy)"
)


def _fused_available(device: torch.device) -> bool:
    """The one-pass Triton sampler (:mod:`rlforge.rollout.native.triton_sampler`) runs here."""
    from rlforge.rollout.native.attention import _triton_available

    return _triton_available(device)


def sample_with_log_probs(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
    with_log_probs: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``logits: [B, V]`` (any float dtype) -> ``(token ids [B] int64, log-probs [B] float32
    or None, finite [])``.

    The draw is ``argmax(y - log E)`` with ``E ~ Exp(1)``: the Gumbel-max form of the
    exponential race, so no softmax is materialised.  ``finite`` is a 0-dim bool tensor on
    the device, False when a row's chosen logit is not finite (a NaN or +inf anywhere in a
    row wins the argmax, so it is caught there); it is returned, not checked, so the caller
    decides when to synchronise.  ``with_log_probs=False`` skips the log-sum-exp pass.

    On CUDA without top-k/top-p, :func:`rlforge.rollout.native.triton_sampler.fused_sample`
    draws from the same distribution, ``softmax(logits / T)``, by the inverse CDF in two Triton
    kernels (other random numbers, so its tokens differ from this path's for the same seed);
    other cases use torch ops.
    """
    filtered = (0 < params.top_k < logits.shape[-1]) or params.top_p < 1.0
    if logits.is_cuda and not filtered and _fused_available(logits.device):
        from rlforge.rollout.native.triton_sampler import fused_sample

        return fused_sample(logits, params.temperature, params.greedy, generator, with_log_probs)
    x = logits.float()
    if not params.greedy and params.temperature != 1.0:
        x = x / params.temperature
    if params.greedy:
        tok = x.argmax(dim=-1)
    else:
        y = x
        if params.top_k > 0 and params.top_k < x.shape[-1]:
            kth = torch.topk(y, params.top_k, dim=-1).values[..., -1:]
            y = y.masked_fill(y < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_y, order = torch.sort(y, dim=-1, descending=False)
            cum = sorted_y.softmax(-1).cumsum(-1)
            remove = cum <= 1 - params.top_p
            remove[..., -1] = False
            y = y.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
        gumbel = torch.empty_like(y).exponential_(generator=generator).log_()
        tok = (y - gumbel).argmax(dim=-1)
    picked = x.gather(-1, tok[:, None]).squeeze(-1)
    finite = torch.isfinite(picked).all()
    logp = picked - torch.logsumexp(x, dim=-1) if with_log_probs else None
    return tok, logp, finite


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """``logits: [B, V]`` -> token ids ``[B]``; ``generator`` None uses torch's global RNG.

    Raises RLForgeError when the logits are not finite (this synchronises the host).
    """
    tok, _, finite = sample_with_log_probs(logits, params, generator)
    if not bool(finite):
        raise RLForgeError(NON_FINITE)
    return tok

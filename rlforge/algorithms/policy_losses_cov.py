"""Covariance-based entropy control: ``clip_cov`` and ``kl_cov`` (``POLICY_LOSSES``).

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv:2505.22617, §4 (eq. 10-12): the entropy change of a softmax policy follows the
covariance between a token's log-probability and its advantage; a handful of tokens with a
large covariance drive entropy collapse.  Per valid token
``cov_t = (A_t - mean(A)) * (log_prob_t - mean(log_prob))`` (means over the valid tokens of the
batch given, log_prob detached).  Clip-Cov drops the gradient of a random few tokens whose
covariance lies in ``(clip_cov_lb, clip_cov_ub)``; KL-Cov adds a ``|log ratio|`` penalty to the
top fraction by covariance.  Config keys (``actor.policy_loss``): ``clip_cov_ratio``,
``clip_cov_lb``, ``clip_cov_ub``, ``kl_cov_ratio``, ``ppo_kl_coef``.

Follows verl's ``compute_policy_loss_clip_cov`` / ``_kl_cov``.  Deviations: the token
log-ratio is clamped to [-20, 20] before ``exp`` (as the vanilla loss); the random selection
draws from ``inputs.generator`` (or torch's global RNG), never from NumPy or Python ``random``.
Note (as in verl): the token selection uses the statistics of the batch it is given, so these
two losses are *not* exactly micro-batch invariant; their aggregation still uses the globals.
"""

from __future__ import annotations

from typing import Any

import torch

from rlforge.errors import ConfigError

from .policy_losses import (
    LOG_RATIO_CLAMP,
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossOutput,
    clip_range,
)
from .utils import masked_mean

_KEY = "actor_rollout_ref.actor.policy_loss"


def _token_cov(adv: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, R) covariance term per token with batch means over the valid tokens (no grad)."""
    lp = log_prob.detach()
    return (adv - masked_mean(adv, mask)) * (lp - masked_mean(lp, mask))


@POLICY_LOSSES.register("clip_cov")
def compute_policy_loss_clip_cov(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """Clip-Cov (Cui et al. 2025, arXiv:2505.22617, Algorithm 1 / eq. 11).

    PPO clip per token, ``L_t = max(-A r, -A clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high))``
    (no dual clip, as verl).  Candidates: valid tokens *not* already clipped by PPO with
    ``clip_cov_lb < cov_t < clip_cov_ub``.  ``n = max(int(clip_cov_ratio * num_valid_tokens), 1)``
    of them, drawn uniformly without replacement, get ``L_t`` multiplied by 0 (gradient
    detached from the update).  Aggregated with ``loss_agg_mode``.

    Metrics: ``pg_clipfrac`` = fraction of valid tokens zeroed by the covariance clip;
    ``ppo_kl`` (k1, nats/token).

    Raises:
        ConfigError: if ``clip_cov_ratio <= 0`` or ``clip_cov_lb >= clip_cov_ub``.
    """
    pl = config.policy_loss
    ratio_frac, lb, ub = float(pl.clip_cov_ratio), float(pl.clip_cov_lb), float(pl.clip_cov_ub)
    if ratio_frac <= 0:
        raise ConfigError(f"{_KEY}.clip_cov_ratio={ratio_frac} must be > 0 for loss_mode=clip_cov")
    if lb >= ub:
        raise ConfigError(f"{_KEY}.clip_cov_lb={lb} must be < {_KEY}.clip_cov_ub={ub}")
    low, high = clip_range(config)
    adv, mask = inputs.advantages, inputs.response_mask
    log_ratio = (inputs.log_prob - inputs.old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - low, 1.0 + high)
    valid = mask > 0
    with torch.no_grad():
        cov = _token_cov(adv, inputs.log_prob, mask)
        candidates = valid & ~(loss_clipped > loss_unclipped) & (cov > lb) & (cov < ub)
        cand_idx = torch.nonzero(candidates)
        num_clip = max(int(ratio_frac * float(mask.sum())), 1)
        keep = torch.ones_like(adv)
        if len(cand_idx) > 0:
            gen = inputs.generator
            perm = torch.randperm(len(cand_idx), generator=gen, device=gen.device if gen is not None else "cpu")
            chosen = cand_idx[perm[:num_clip].to(cand_idx.device)]
            keep[chosen[:, 0], chosen[:, 1]] = 0.0
    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * keep
    metrics = {
        "pg_clipfrac": float(masked_mean((keep == 0).float(), mask)),
        "ppo_kl": float(masked_mean(-log_ratio.detach(), mask)),
    }
    return PolicyLossOutput(loss=inputs.agg(pg_losses), metrics=metrics)


@POLICY_LOSSES.register("kl_cov")
def compute_policy_loss_kl_cov(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617, eq. 12).

    No ratio clip.  Per token ``L_t = -A r`` with ``r = exp(clamp(log_prob - old_log_prob, -20, 20))``;
    for the ``k = max(1, int(kl_cov_ratio * num_valid_tokens))`` valid tokens with the largest
    ``cov_t`` (``torch.topk``; ties broken by torch) ``L_t = -A r + ppo_kl_coef * |log_prob - old_log_prob|``.
    Aggregated with ``loss_agg_mode``.

    Metrics: ``ppo_kl`` = masked mean of ``|log_prob - old_log_prob|`` (verl reports the absolute
    log-ratio here), ``pg_clipfrac`` = fraction of valid tokens penalised.

    Raises:
        ConfigError: if ``kl_cov_ratio <= 0``.
    """
    pl = config.policy_loss
    ratio_frac, coef = float(pl.kl_cov_ratio), float(pl.ppo_kl_coef)
    if ratio_frac <= 0:
        raise ConfigError(f"{_KEY}.kl_cov_ratio={ratio_frac} must be > 0 for loss_mode=kl_cov")
    adv, mask = inputs.advantages, inputs.response_mask
    log_ratio = (inputs.log_prob - inputs.old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    abs_kl = log_ratio.abs()
    pg_losses = -adv * torch.exp(log_ratio)
    penalised = torch.zeros_like(adv)
    with torch.no_grad():
        valid_flat = torch.nonzero((mask > 0).reshape(-1), as_tuple=True)[0]
        if valid_flat.numel() > 0:
            cov = _token_cov(adv, inputs.log_prob, mask).reshape(-1)[valid_flat]
            k = max(1, int(valid_flat.numel() * ratio_frac))
            top = valid_flat[torch.topk(cov, min(k, cov.numel())).indices]
            penalised.view(-1)[top] = 1.0
    pg_losses = pg_losses + penalised * coef * abs_kl
    metrics = {
        "pg_clipfrac": float(masked_mean(penalised, mask)),
        "ppo_kl": float(masked_mean(abs_kl.detach(), mask)),
    }
    return PolicyLossOutput(loss=inputs.agg(pg_losses), metrics=metrics)

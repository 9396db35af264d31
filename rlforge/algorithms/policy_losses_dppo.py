"""Divergence-masked and quadratic-penalty policy losses: ``dppo_tv``, ``dppo_kl`` and ``dro``.

Each is ``fn(inputs: PolicyLossInputs, config) -> PolicyLossOutput`` registered in
:data:`~rlforge.algorithms.policy_losses.POLICY_LOSSES` under verl 0.9's name, with ``config`` the
actor config (``actor_rollout_ref.actor``).  Tensors are (B, R): B sequences, R response tokens;
log-probs in nats.  Names, keys and defaults follow verl's ``core_algos.py``
(``compute_policy_loss_dppo_tv``, ``_dppo_kl``, ``_dro``) and its docs (``docs/algo/dppo.md``,
``docs/algo/dro.md``).

DPPO (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning",
arXiv:2602.04879).  PPO's ratio clip is replaced by a mask on an estimate of the divergence
between the old and the new token distribution, restricted to the sampled token ("binary"
approximation: the two-outcome distribution {sampled token, everything else}).  Per token, with
``p = exp(log_prob)``, ``q = exp(old_log_prob)``:

* ``dppo_tv``: the binary total variation is ``|p - q|``.  A token with ``A > 0`` is kept while
  ``p - q <= clip_ratio_high``; one with ``A <= 0`` while ``p - q >= -clip_ratio_low``.
* ``dppo_kl``: the binary KL ``KL_b = q log(q/p) + (1-q) log((1-q+1e-8)/(1-p+1e-8))``.  A token
  with ``A > 0`` is kept while ``KL_b <= clip_ratio_high`` or ``p <= q`` (it has not moved up);
  one with ``A <= 0`` while ``KL_b <= clip_ratio_low`` or ``p >= q``.

The kept tokens train with a REINFORCE objective weighted by the truncated importance ratio
(the paper's §5.4, in place of PPO's dual clip):
``L = -A * sg(min(r, clip_ratio_c)) * log_prob * keep`` with ``r = exp(clamp(log_prob -
old_log_prob, -20, 20))``, aggregated with ``loss_agg_mode``.  Here ``clip_ratio_low`` /
``clip_ratio_high`` (falling back to ``clip_ratio``) are divergence thresholds, not ratio
epsilons: verl's DPPO example uses 0.15 for TV and 0.05 for KL, with ``clip_ratio_c=10000``
(a large truncation, as the paper recommends; the key's default is 3.0).

Metrics (verl's): ``pg_clipfrac`` = masked fraction of valid tokens; ``pg_clipfrac_lower`` =
fraction of valid tokens that are kept and whose ratio exceeds ``clip_ratio_c`` (truncated);
``ppo_kl`` = masked mean of ``old_log_prob - log_prob`` (nats/token).

Deviation from verl: verl also multiplies by rollout-correction weights
(``algorithm.rollout_correction``), which rlforge does not compute.
"""

from __future__ import annotations

from typing import Any

import torch

from rlforge.errors import ConfigError

from .policy_losses import LOG_RATIO_CLAMP, POLICY_LOSSES, PolicyLossInputs, PolicyLossOutput, clip_range
from .utils import masked_mean

BINARY_KL_EPS = 1e-8
"""Added to both ``1 - p`` and ``1 - q`` inside the binary KL's second log (verl's value)."""


def _dppo_loss(inputs: PolicyLossInputs, config: Any, keep: torch.Tensor, log_ratio: torch.Tensor) -> PolicyLossOutput:
    """The truncated-IS REINFORCE loss on the kept tokens, and DPPO's metrics."""
    clip_ratio_c = float(config.clip_ratio_c)
    mask = inputs.response_mask
    ratio = torch.exp(log_ratio)
    truncated = ratio.clamp(max=clip_ratio_c).detach()
    keep = keep.detach().to(inputs.log_prob.dtype)
    pg_losses = -inputs.advantages * truncated * inputs.log_prob * keep
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean(1.0 - keep, mask),
            "pg_clipfrac_lower": masked_mean((ratio > clip_ratio_c).to(keep.dtype) * keep, mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return PolicyLossOutput(loss=inputs.agg(pg_losses), metrics=metrics)


def _probs(inputs: PolicyLossInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log-ratio clamped to [-20, 20], p = new prob, q = old prob), all detached except the ratio."""
    log_ratio = (inputs.log_prob - inputs.old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return log_ratio, torch.exp(inputs.log_prob.detach()), torch.exp(inputs.old_log_prob)


@POLICY_LOSSES.register("dppo_tv")
def compute_policy_loss_dppo_tv(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """DPPO-Binary-TV (Qi et al. 2026, arXiv:2602.04879; verl ``docs/algo/dppo.md``).

    Keep mask: ``p - q <= clip_ratio_high`` where ``A > 0``, ``p - q >= -clip_ratio_low``
    elsewhere (``p``, ``q``: new and old probability of the sampled token).  Loss and metrics: see
    the module docstring.
    """
    low, high = clip_range(config)
    log_ratio, p, q = _probs(inputs)
    keep = torch.where(inputs.advantages > 0, p - q <= high, p - q >= -low)
    return _dppo_loss(inputs, config, keep, log_ratio)


@POLICY_LOSSES.register("dppo_kl")
def compute_policy_loss_dppo_kl(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """DPPO-Binary-KL (Qi et al. 2026, arXiv:2602.04879; verl ``docs/algo/dppo.md``).

    ``KL_b = q (log q - log p) + (1 - q) log((1 - q + 1e-8) / (1 - p + 1e-8))``; keep mask:
    ``KL_b <= clip_ratio_high or p <= q`` where ``A > 0``, ``KL_b <= clip_ratio_low or p >= q``
    elsewhere.  Loss and metrics: see the module docstring.
    """
    low, high = clip_range(config)
    log_ratio, p, q = _probs(inputs)
    log_p, log_q = inputs.log_prob.detach(), inputs.old_log_prob
    binary_kl = q * (log_q - log_p) + (1.0 - q) * torch.log((1.0 - q + BINARY_KL_EPS) / (1.0 - p + BINARY_KL_EPS))
    keep = torch.where(inputs.advantages > 0, (binary_kl <= high) | (p <= q), (binary_kl <= low) | (p >= q))
    return _dppo_loss(inputs, config, keep, log_ratio)


@POLICY_LOSSES.register("dro")
def compute_policy_loss_dro(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """Direct Reward Optimization's policy loss with a quadratic log-ratio penalty (verl
    ``docs/algo/dro.md``; the single-trajectory DRO objective of Richemond et al. 2024,
    "Offline Regularised Reinforcement Learning for LLM Alignment", arXiv:2405.19107, with the
    old policy in place of the reference).

    Per token ``L = -(log_prob * A - beta / 2 * (log_prob - old_log_prob)^2)`` with
    ``beta = policy_loss.dro_beta``, aggregated with ``loss_agg_mode`` (verl's doc writes the sum
    over tokens: ``loss_agg_mode=token-sum``).  No ratio, no clip: the penalty keeps the update
    near the old policy.  The advantages are whatever the estimator gives (verl: "DRO expects the
    caller to construct advantages appropriate for its soft off-policy formulation").

    Metrics: ``ppo_kl`` (masked mean of ``old_log_prob - log_prob``, nats/token).

    Raises:
        ConfigError: if ``policy_loss.dro_beta`` is unset (null) or not > 0.
    """
    beta = config.policy_loss.dro_beta
    if beta is None or float(beta) <= 0:
        raise ConfigError(
            f"actor_rollout_ref.actor.policy_loss.dro_beta={beta}: loss_mode=dro needs a positive "
            "quadratic-penalty coefficient (verl's example: 0.05)"
        )
    log_ratio = inputs.log_prob - inputs.old_log_prob
    pg_losses = -(inputs.log_prob * inputs.advantages - 0.5 * float(beta) * log_ratio.square())
    with torch.no_grad():
        metrics = {"ppo_kl": masked_mean(-log_ratio, inputs.response_mask)}
    return PolicyLossOutput(loss=inputs.agg(pg_losses), metrics=metrics)

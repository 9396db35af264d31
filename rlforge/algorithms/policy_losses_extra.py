"""Policy losses beyond PPO's clip: gspo, sapo, gpg, geo_mean, cispo (``POLICY_LOSSES``).

Each is ``fn(inputs: PolicyLossInputs, config) -> PolicyLossOutput`` with ``config`` the actor
config (``actor_rollout_ref.actor``; clip keys ``clip_ratio``, ``clip_ratio_low``,
``clip_ratio_high``; SAPO's ``tau_pos`` / ``tau_neg``).  Tensors are (B, R): B sequences,
R response tokens; log-probs in nats.  Formulas follow verl's ``core_algos.py``
(``compute_policy_loss_gspo``, ``_sapo``, ``_gpg``, ``_geo_mean``, ``_cispo``) and the papers.

Deviations from verl:
* ``gspo`` and ``sapo`` always aggregate with ``seq-mean-token-mean`` (as verl), but through
  :meth:`PolicyLossInputs.agg`, so the mini-batch globals keep them micro-batch invariant.
* ``geo_mean`` averages over the sequences with a valid token (``global_num_seqs`` when given)
  instead of ``torch.mean`` over all rows, and clamps the token log-ratio to [-20, 20] first.
* ``gpg`` reports ``ppo_kl`` (verl reports nothing).
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
from .utils import masked_mean, masked_sum

GSPO_LOG_RATIO_MAX = 10.0
"""Upper clamp of GSPO's log sequence ratio before ``exp`` (verl's value)."""


def _log_ratio(inputs: PolicyLossInputs) -> torch.Tensor:
    return (inputs.log_prob - inputs.old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _ppo_kl(log_ratio: torch.Tensor, mask: torch.Tensor) -> float:
    return float(masked_mean(-log_ratio.detach(), mask))


@POLICY_LOSSES.register("gspo")
def compute_policy_loss_gspo(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """Group Sequence Policy Optimization (Zheng et al. 2025, arXiv:2507.18071, eq. 5-7 and the
    token-level GSPO-token form, eq. 13-14).

    Sequence ratio ``s_i = exp(mean_t (log_prob - old_log_prob))`` over the valid tokens of i.
    Token form with stop-gradient (``sg``): ``log s_{i,t} = sg(log s_i) + log_prob_t - sg(log_prob_t)``,
    clamped above at 10 before ``exp``; its value is ``s_i`` at every token and its gradient is
    ``s_i * grad log_prob_t``.  Per token ``L = max(-A * s_{i,t}, -A * clip(s_{i,t}, 1 - clip_ratio_low,
    1 + clip_ratio_high))``, aggregated with ``seq-mean-token-mean`` whatever
    ``loss_agg_mode`` says (verl does the same: the ratio is a sequence quantity).  The paper
    uses much smaller clip ranges than PPO (e.g. 3e-4 / 4e-4).

    Metrics: ``pg_clipfrac`` (valid tokens where the clipped branch is strictly larger),
    ``pg_clipfrac_lower`` (always 0, kept for the metric set), ``ppo_kl`` (k1, nats/token).
    """
    low, high = clip_range(config)
    adv, mask = inputs.advantages, inputs.response_mask
    log_ratio = inputs.log_prob - inputs.old_log_prob
    seq_log_ratio = masked_sum(log_ratio, mask, dim=-1) / mask.sum(dim=-1).clamp_min(1.0)
    log_s = inputs.log_prob - inputs.log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    s = torch.exp(log_s.clamp(max=GSPO_LOG_RATIO_MAX))
    loss_unclipped = -adv * s
    loss_clipped = -adv * s.clamp(1.0 - low, 1.0 + high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": float(masked_mean((loss_clipped > loss_unclipped).float(), mask)),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": _ppo_kl(log_ratio, mask),
        }
    return PolicyLossOutput(loss=inputs.agg(pg_losses, "seq-mean-token-mean"), metrics=metrics)


@POLICY_LOSSES.register("sapo")
def compute_policy_loss_sapo(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv:2511.20347, eq. 5-6),
    as verl's ``compute_policy_loss_sapo``.

    Token ratio ``r = exp(clamp(log_prob - old_log_prob, -20, 20))``; temperature
    ``tau = tau_pos`` where ``A > 0`` else ``tau_neg``; soft gate
    ``f(r) = sigmoid(tau * (r - 1)) * 4 / tau`` (value ``2 / tau`` and slope 1 at ``r = 1``, so
    on-policy it matches the plain policy gradient; the gradient decays smoothly as r leaves 1
    instead of being cut off by a hard clip).  Per token ``L = -f(r) * A``, aggregated with
    ``seq-mean-token-mean`` whatever ``loss_agg_mode`` says (verl does the same).

    Config: ``actor.tau_pos`` (paper: 1.0), ``actor.tau_neg`` (paper: 1.05; larger = faster decay
    for negative advantages).  Metrics: ``ppo_kl``.

    Raises:
        ConfigError: if ``tau_pos`` or ``tau_neg`` is not > 0.
    """
    tau_pos, tau_neg = float(config.tau_pos), float(config.tau_neg)
    if tau_pos <= 0 or tau_neg <= 0:
        raise ConfigError(
            f"actor_rollout_ref.actor.tau_pos={tau_pos} and tau_neg={tau_neg} must both be > 0 for loss_mode=sapo"
        )
    adv, mask = inputs.advantages, inputs.response_mask
    log_ratio = _log_ratio(inputs)
    ratio = torch.exp(log_ratio)
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gate * adv
    metrics = {"ppo_kl": _ppo_kl(log_ratio, mask)}
    return PolicyLossOutput(loss=inputs.agg(pg_losses, "seq-mean-token-mean"), metrics=metrics)


@POLICY_LOSSES.register("gpg")
def compute_policy_loss_gpg(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """Group Policy Gradient loss (Chu et al. 2025, arXiv:2504.02546, eq. 6): plain REINFORCE,
    no ratio and no clip.

    Per token ``L = -log_prob * A``, aggregated with ``loss_agg_mode``.  Pair it with
    ``algorithm.adv_estimator=gpg``.  Metrics: ``ppo_kl`` (k1 of old vs new, nats/token).
    """
    pg_losses = -inputs.log_prob * inputs.advantages
    metrics = {"ppo_kl": _ppo_kl(_log_ratio(inputs), inputs.response_mask)}
    return PolicyLossOutput(loss=inputs.agg(pg_losses), metrics=metrics)


@POLICY_LOSSES.register("geo_mean")
def compute_policy_loss_geo_mean(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """Geometric-Mean Policy Optimization (GMPO, Zhao et al. 2025, arXiv:2507.20673, eq. 4-7),
    as verl's ``compute_policy_loss_geo_mean``.

    Per token ``x = clamp(log_prob - old_log_prob, -20, 20)``; clipped in log space by the
    advantage's sign: ``x' = sgn(A) * min(sgn(A) * x, sgn(A) * clamp(x, -clip_ratio_low,
    clip_ratio_high))`` (upper clip for ``A > 0``, lower clip for ``A < 0``; verl uses the clip
    ratios directly as log-space bounds, the paper's (e^-0.4, e^0.4) is ``clip_ratio=0.4``).
    Per sequence ``rho_i = exp(mean_t x')`` (geometric mean of the token ratios) and
    ``A_i = mean_t A``; ``L_i = -A_i * rho_i``; the loss is the mean of ``L_i`` over sequences
    (``loss_agg_mode`` is ignored, as in verl).  With rollout-correction weights ``w`` each
    ``L_i`` is multiplied by ``exp(mean_t log w_t)`` (verl).

    Metrics: ``pg_clipfrac`` / ``pg_clipfrac_lower``: valid tokens with ``x`` outside
    ``[-clip_ratio_low, clip_ratio_high]`` and ``A > 0`` / ``A < 0`` (verl's definition);
    ``ppo_kl``.
    """
    low, high = clip_range(config)
    adv, mask = inputs.advantages, inputs.response_mask
    x = _log_ratio(inputs)
    sgn = torch.sign(adv)
    x_clamped = x.clamp(-low, high)
    x_min = sgn * torch.minimum(sgn * x, sgn * x_clamped)
    lengths = mask.sum(dim=-1).clamp_min(1.0)
    rho = torch.exp(masked_sum(x_min, mask, dim=-1) / lengths)
    seq_adv = masked_sum(adv, mask, dim=-1) / lengths
    seq_losses = -seq_adv * rho
    if inputs.rollout_is_weights is not None:  # verl: the weights' geometric mean per sequence
        w = inputs.rollout_is_weights.detach()
        seq_losses = seq_losses * torch.exp(masked_sum(torch.log(w + 1e-10), mask, dim=-1) / lengths)
    loss = inputs.seq_mean(seq_losses)
    with torch.no_grad():
        clipped = (x != x_clamped).float()
        metrics = {
            "pg_clipfrac": float(masked_mean(clipped * (adv > 0), mask)),
            "pg_clipfrac_lower": float(masked_mean(clipped * (adv < 0), mask)),
            "ppo_kl": _ppo_kl(x, mask),
        }
    return PolicyLossOutput(loss=loss, metrics=metrics)


@POLICY_LOSSES.register("cispo")
def compute_policy_loss_cispo(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """Clipped IS-weight Policy Optimization (MiniMax-M1, 2025, arXiv:2506.13585, eq. 4-5),
    as verl's ``compute_policy_loss_cispo``.

    Per token ``r = exp(clamp(log_prob - old_log_prob, -20, 20))``,
    ``L = -sg(clip(r, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A * log_prob``: the IS weight
    is clipped and detached, so every token keeps a gradient ``-clip(r) * A`` (no token is
    dropped, unlike PPO's clip).  Aggregated with ``loss_agg_mode``.  The paper sets no
    effective lower bound (large ``clip_ratio_low``) and tunes only the upper one.

    Metrics: ``pg_clipfrac`` (valid tokens whose weight was clipped, either side), ``ppo_kl``.
    """
    low, high = clip_range(config)
    adv, mask = inputs.advantages, inputs.response_mask
    log_ratio = _log_ratio(inputs)
    ratio = torch.exp(log_ratio).detach()
    weight = ratio.clamp(1.0 - low, 1.0 + high)
    pg_losses = -weight * adv * inputs.log_prob
    metrics = {
        "pg_clipfrac": float(masked_mean((weight != ratio).float(), mask)),
        "ppo_kl": _ppo_kl(log_ratio, mask),
    }
    return PolicyLossOutput(loss=inputs.agg(pg_losses), metrics=metrics)

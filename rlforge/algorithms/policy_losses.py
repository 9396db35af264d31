"""Policy losses, selected by ``actor_rollout_ref.actor.policy_loss.loss_mode``.

Every loss is one function registered in :data:`POLICY_LOSSES` with the signature
``fn(inputs: PolicyLossInputs, config) -> PolicyLossOutput`` where ``config`` is the actor
config (read by verl attribute names: ``clip_ratio``, ``clip_ratio_low``, ``clip_ratio_high``,
``clip_ratio_c``).  Later losses (gspo, flowrl, ...) read the optional fields of
:class:`PolicyLossInputs`; the caller only runs ``compute_policy_loss(inputs, config)``.
The other losses live in :mod:`~rlforge.algorithms.policy_losses_extra` (gspo, sapo, gpg,
geo_mean, cispo), :mod:`~rlforge.algorithms.policy_losses_cov` (clip_cov, kl_cov),
:mod:`~rlforge.algorithms.policy_losses_dppo` (dppo_tv, dppo_kl, dro) and
:mod:`~rlforge.algorithms.flowrl` (flowrl).

Deviation from the PPO paper: the log-ratio is clamped to [-20, 20] before ``exp`` (as verl)
so a stale token cannot overflow; the dual clip of Ye et al. 2020 applies to negative
advantages only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlforge.errors import ConfigError
from rlforge.registry import Registry

from .aggregation import agg_loss
from .utils import masked_mean, select_valid

LOG_RATIO_CLAMP = 20.0


@dataclass
class PolicyLossInputs:
    """Everything a policy loss may read; tensors are (B, R), log-probs float32 nats.

    Attributes:
        old_log_prob: log pi_old(a_t|s_t) of the policy that generated the batch (no grad).
        log_prob: log pi_theta(a_t|s_t) of the policy being trained (with grad).
        advantages: per-token advantages.
        response_mask: 1 for tokens that count in the loss.
        loss_agg_mode: see :func:`rlforge.algorithms.aggregation.agg_loss`.
        global_num_tokens, global_num_seqs, horizon: mini-batch totals for gradient
            accumulation, passed on to ``agg_loss`` (None = this batch alone).
        dp_size: ranks whose gradients are averaged, passed on to ``agg_loss`` (``token-sum``).
        ref_log_prob: log pi_ref, for losses that need the reference policy.
        token_level_rewards: per-token rewards, for losses that need them (e.g. flowrl).
        index: (B,) group ids (prompt uids), for group-level losses.
        log_z: (B,) learned log partition function log Z(x) of each sequence's prompt, with
            grad (``flowrl`` only; the actor's log-Z head produces it).
        generator: RNG for losses that sample (``clip_cov``); None = torch's global RNG.
        rollout_is_weights: (B, R) truncated importance weights of rollout correction
            (``algorithm.rollout_correction.rollout_is``; no grad), or None.  :meth:`agg` multiplies
            the per-token loss by them before aggregating (verl multiplies ``pg_losses``);
            ``geo_mean`` uses their per-sequence geometric mean.
        extra: anything else a later loss needs, by name.

    The (B, R) data without grad (``old_log_prob``, ``advantages``, ``ref_log_prob``,
    ``token_level_rewards``) is set to 0 at the positions where ``response_mask`` is 0 when the
    object is built (:func:`~rlforge.algorithms.utils.select_valid`): a NaN or inf there
    (padding, a -inf log-prob from the rollout) reaches neither the loss nor the gradient of
    ``log_prob``.  ``log_prob`` itself is kept as given (callers read its ``.grad``); the
    losses' masked reductions keep a non-finite value of it at a masked position out of the loss.
    """

    old_log_prob: torch.Tensor
    log_prob: torch.Tensor
    advantages: torch.Tensor
    response_mask: torch.Tensor
    loss_agg_mode: str = "token-mean"
    global_num_tokens: float | None = None
    global_num_seqs: float | None = None
    horizon: float | None = None
    dp_size: int = 1
    ref_log_prob: torch.Tensor | None = None
    token_level_rewards: torch.Tensor | None = None
    index: np.ndarray | None = None
    log_z: torch.Tensor | None = None
    generator: torch.Generator | None = None
    rollout_is_weights: torch.Tensor | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        mask = self.response_mask
        for name in ("old_log_prob", "advantages", "ref_log_prob", "token_level_rewards"):
            value = getattr(self, name)
            if isinstance(value, torch.Tensor) and value.shape == mask.shape:
                setattr(self, name, select_valid(value, mask))

    def agg(self, loss_mat: torch.Tensor, loss_agg_mode: str | None = None) -> torch.Tensor:
        """Aggregate a (B, R) loss with this batch's mask and globals, each token's loss first
        multiplied by its ``rollout_is_weights`` when given.

        ``loss_agg_mode`` overrides the configured mode (for losses that fix it, e.g. gspo);
        None = ``self.loss_agg_mode``.
        """
        if self.rollout_is_weights is not None:
            loss_mat = loss_mat * self.rollout_is_weights.detach()
        return agg_loss(
            loss_mat,
            self.response_mask,
            self.loss_agg_mode if loss_agg_mode is None else loss_agg_mode,
            global_num_tokens=self.global_num_tokens,
            global_num_seqs=self.global_num_seqs,
            horizon=self.horizon,
            dp_size=self.dp_size,
        )

    def seq_mean(self, seq_losses: torch.Tensor) -> torch.Tensor:
        """Mean of a per-sequence loss (B,) over the sequences with a valid token.

        Sequences without a valid token are dropped; the sum is divided by
        ``global_num_seqs`` when given (so micro-batch shares add up to the mini-batch mean),
        else by this batch's count of sequences with a valid token.
        """
        valid = self.response_mask.sum(dim=-1) > 0
        total = torch.where(valid, seq_losses, torch.zeros_like(seq_losses)).sum()
        if self.global_num_seqs is not None:
            if self.global_num_seqs <= 0:
                raise ValueError(f"global_num_seqs must be > 0, got {self.global_num_seqs}")
            return total / float(self.global_num_seqs)
        return total / valid.sum().clamp_min(1).to(total.dtype)


@dataclass
class PolicyLossOutput:
    """Result of a policy loss.

    Attributes:
        loss: 0-dim tensor to back-propagate (this micro-batch's share when globals are given).
        metrics: values for logging, floats or 0-dim tensors (read back by the engine once per
            step), e.g. ``pg_clipfrac``, ``ppo_kl``, ``pg_clipfrac_lower`` (fractions in [0, 1];
            ppo_kl in nats per token).
    """

    loss: torch.Tensor
    metrics: dict[str, float | torch.Tensor] = field(default_factory=dict)


PolicyLossFn = Callable[[PolicyLossInputs, Any], PolicyLossOutput]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry(
    "policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode"
)


def compute_policy_loss(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """Run the loss named by ``config.policy_loss.loss_mode`` (the actor config)."""
    return POLICY_LOSSES.get(config.policy_loss.loss_mode)(inputs, config)


def clip_range(config: Any) -> tuple[float, float]:
    """(clip_ratio_low, clip_ratio_high), each falling back to ``clip_ratio`` when None."""
    low, high = config.clip_ratio_low, config.clip_ratio_high
    low = config.clip_ratio if low is None else low
    high = config.clip_ratio if high is None else high
    return float(low), float(high)


@POLICY_LOSSES.register("vanilla")
def compute_policy_loss_vanilla(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """PPO clipped surrogate with dual clip.

    PPO (Schulman et al. 2017, arXiv:1707.06347, eq. 7), per token:
    ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``,
    ``L = max(-A * ratio, -A * clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high))``.
    Dual clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games", arXiv:1912.09729, eq. 5):
    for ``A < 0`` the loss is capped, ``L = min(L, -A * clip_ratio_c)``.

    Metrics (over valid tokens): ``pg_clipfrac`` = fraction where the clipped branch is strictly
    larger (verl's definition); ``pg_clipfrac_lower`` = fraction with ``A < 0`` where the dual
    cap is active; ``ppo_kl`` = masked mean of ``old_log_prob - log_prob`` (k1 estimate, nats).

    Raises:
        ConfigError: if ``clip_ratio_c <= 1``.
    """
    clip_ratio_c = float(config.clip_ratio_c)
    if clip_ratio_c <= 1.0:
        raise ConfigError(
            f"actor_rollout_ref.actor.clip_ratio_c must be > 1.0 (dual-clip lower bound), got {clip_ratio_c}"
        )
    low, high = clip_range(config)
    adv, mask = inputs.advantages, inputs.response_mask
    log_ratio = (inputs.log_prob - inputs.old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)

    loss_unclipped = -adv * ratio
    loss_clipped = -adv * ratio.clamp(1.0 - low, 1.0 + high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_cap = -adv * clip_ratio_c
    negative = adv < 0
    pg_losses = torch.where(negative, torch.minimum(loss_ppo, loss_cap), loss_ppo)

    with torch.no_grad():
        metrics = {  # 0-d device tensors: the engine reads a step's metrics back in one copy
            "pg_clipfrac": masked_mean((loss_clipped > loss_unclipped).float(), mask),
            "pg_clipfrac_lower": masked_mean(((loss_ppo > loss_cap) & negative).float(), mask),
            "ppo_kl": masked_mean(-log_ratio, mask),
        }
    return PolicyLossOutput(loss=inputs.agg(pg_losses), metrics=metrics)

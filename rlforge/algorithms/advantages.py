"""Advantage estimators, selected by ``algorithm.adv_estimator``.

Every estimator is one function registered in :data:`ADV_ESTIMATORS` with the signature
``fn(inputs: AdvantageInputs, config) -> (advantages (B, R), returns (B, R))`` where ``config``
is the ``algorithm`` config section (read by verl attribute names).  New estimators (rloo,
reinforce++, ...) add optional fields to :class:`AdvantageInputs`; the caller only ever runs
``compute_advantage(inputs, config)``.

The outcome-reward estimators (rloo, reinforce++, remax, opo, gpg, grpo_passk) live in
:mod:`rlforge.algorithms.advantages_outcome`; the optimal token baseline (both variants) and
gdpo in :mod:`rlforge.algorithms.advantages_otb`.

Deviations from verl (``verl/trainer/ppo/core_algos.py``):
* ``gae`` and ``grpo`` return zeros at masked positions for both advantages and returns
  (verl leaves the carried-over values there; every loss masks them anyway).
* ``grpo`` groups with one vectorized scatter instead of a Python loop over samples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from rlforge.errors import ConfigError
from rlforge.registry import Registry

from .groups import group_ids, grpo_normalized_scores, require_index
from .utils import apply_mask, masked_whiten, select_valid

GRPO_EPS = 1e-6


@dataclass
class AdvantageInputs:
    """Everything an advantage estimator may read.

    Attributes:
        token_level_rewards: (B, R) float rewards per response token (outcome rewards sit on the
            last valid token; KL-in-reward already subtracted).
        response_mask: (B, R) 1 for real response tokens, 0 for padding / observation tokens.
        index: (B,) group ids (the prompt ``uid`` strings); responses to one prompt share an id.
            Needed by group estimators (grpo, rloo, ...); None otherwise.
        values: (B, R) critic values V(s_t); needed by ``gae`` only.
        reward_baselines: (B,) reward of the greedy (argmax-decoded) response to the same prompt;
            needed by ``remax`` only (the trainer fills it in its ``gen_max`` stage).
        old_log_probs: (B, R) log-probs of the old policy (nats); needed by the optimal-token-baseline
            estimators only.
        sum_pi_squared: (B, R) ``sum_v pi_v^2`` of the old policy's token distribution (in [0, 1]);
            needed by the optimal-token-baseline estimators (``actor.calculate_sum_pi_squared``).
        reward_components: ``{reward key: (B,) score}``, the reward function's named components
            (``algorithm.gdpo_reward_keys``); needed by ``gdpo`` only.

    ``token_level_rewards``, ``values``, ``old_log_probs`` and ``sum_pi_squared`` are set to 0 at
    masked positions when the object is built (a NaN or inf there does not reach the scores,
    returns or whitening statistics).
    """

    token_level_rewards: torch.Tensor
    response_mask: torch.Tensor
    index: np.ndarray | None = None
    values: torch.Tensor | None = None
    reward_baselines: torch.Tensor | None = None
    old_log_probs: torch.Tensor | None = None
    sum_pi_squared: torch.Tensor | None = None
    reward_components: dict[str, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        shape = self.token_level_rewards.shape
        if self.token_level_rewards.dim() != 2 or self.response_mask.shape != shape:
            raise ValueError(
                f"token_level_rewards {tuple(shape)} and response_mask "
                f"{tuple(self.response_mask.shape)} must both be (batch, response_len)"
            )
        if self.values is not None and self.values.shape != shape:
            raise ValueError(f"values {tuple(self.values.shape)} must match rewards {tuple(shape)}")
        if self.reward_baselines is not None and tuple(self.reward_baselines.shape) != (shape[0],):
            raise ValueError(
                f"reward_baselines {tuple(self.reward_baselines.shape)} must be (batch,) = ({shape[0]},)"
            )
        if self.index is not None and len(self.index) != shape[0]:
            raise ValueError(f"index has {len(self.index)} entries for a batch of {shape[0]}")
        # masked positions count 0 whatever they hold (a NaN there must not reach a score or a whitening)
        self.token_level_rewards = select_valid(self.token_level_rewards, self.response_mask)
        for name in ("values", "old_log_probs", "sum_pi_squared"):
            value = getattr(self, name)
            if value is not None:
                if value.shape != shape:
                    raise ValueError(f"{name} {tuple(value.shape)} must match rewards {tuple(shape)}")
                setattr(self, name, select_valid(value, self.response_mask))
        for key, comp in (self.reward_components or {}).items():
            if tuple(comp.shape) != (shape[0],):
                raise ValueError(f"reward component {key!r} {tuple(comp.shape)} must be (batch,) = ({shape[0]},)")


AdvantageFn = Callable[[AdvantageInputs, Any], tuple[torch.Tensor, torch.Tensor]]

ADV_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator", "algorithm.adv_estimator")


def compute_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator named by ``config.adv_estimator``; returns (advantages, returns), (B, R)."""
    return ADV_ESTIMATORS.get(config.adv_estimator)(inputs, config)


@ADV_ESTIMATORS.register("gae")
@torch.no_grad()
def compute_gae_advantage_return(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438, eq. 11-16).

    Backwards over the valid tokens of each row:
    ``delta_t = r_t + gamma * V(s_next) - V(s_t)``, ``A_t = delta_t + gamma * lam * A_next``,
    where "next" is the next *valid* token (masked positions, e.g. tool observations, are
    skipped; past the last valid token V = 0 and A = 0).  ``returns = A + V`` (before whitening);
    the advantages are then whitened over the valid tokens (:func:`masked_whiten`), as verl does.

    Config: ``gamma`` (discount, per token), ``lam`` (GAE lambda).  Needs ``inputs.values``.

    Returns:
        advantages (B, R) whitened, returns (B, R); both 0 at masked positions.
    """
    if inputs.values is None:
        raise ConfigError("algorithm.adv_estimator='gae' needs critic values; enable the critic")
    rewards, mask, values = inputs.token_level_rewards, inputs.response_mask, inputs.values
    mask = mask.to(values.dtype)
    gamma, lam = float(config.gamma), float(config.lam)
    next_values = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    advantages = torch.zeros_like(values)
    for t in reversed(range(values.shape[1])):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_values - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        # At a masked position keep the carried state unchanged (selected, so a NaN value there
        # does not enter the state).
        next_values = torch.where(m != 0, m * values[:, t] + (1 - m) * next_values, next_values)
        last_gae = torch.where(m != 0, m * gae_t + (1 - m) * last_gae, last_gae)
        advantages[:, t] = last_gae
    returns = apply_mask(advantages + values, mask)
    advantages = apply_mask(masked_whiten(advantages, mask), mask)
    return advantages, returns


@ADV_ESTIMATORS.register("grpo")
@torch.no_grad()
def compute_grpo_outcome_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome-supervised advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, §4.1.2).

    ``score_i = sum_t r_{i,t}``; within each group (same ``index``)
    ``A_i = (score_i - mean(group)) / (std(group) + 1e-6)``, with the *unbiased* std
    (``torch.std``, as verl).  With ``config.norm_adv_by_std_in_grpo`` False (Dr. GRPO,
    Liu et al. 2025) ``A_i = score_i - mean(group)``.  A group of size 1 uses mean 0 and
    std 1 as verl does, so its advantage is ``score / (1 + 1e-6)`` (not 0).
    ``A_i`` is broadcast to every valid token of response i.

    Dr. GRPO (Liu et al. 2025, arXiv:2503.20783, §3.2) is this estimator with
    ``algorithm.norm_adv_by_std_in_grpo=false`` plus
    ``actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm`` (as verl documents it);
    there is no separate registry entry.

    Returns:
        advantages (B, R), returns (B, R): the same tensor (returns = advantages), 0 where masked.
    """
    index = require_index(inputs.index, "grpo")
    mask = inputs.response_mask.to(inputs.token_level_rewards.dtype)
    scores = inputs.token_level_rewards.sum(dim=-1)
    gid = group_ids(index, scores.device)
    adv = grpo_normalized_scores(scores, gid, GRPO_EPS, bool(config.norm_adv_by_std_in_grpo))
    advantages = apply_mask(adv.unsqueeze(-1), mask)
    return advantages, advantages

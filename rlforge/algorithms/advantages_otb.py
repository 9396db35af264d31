"""Token-level and multi-reward advantage estimators of verl 0.9, registered in ``ADV_ESTIMATORS``:
``optimal_token_baseline``, ``tir_optimal_token_baseline`` and ``gdpo``.

Signature as every estimator: ``fn(inputs: AdvantageInputs, config) -> (advantages, returns)``,
``config`` the ``algorithm`` section, tensors (B, R) with B sequences and R response tokens.

Optimal Token Baseline (OTB; Li et al. 2026, arXiv:2602.07078; verl ``docs/algo/otb.md``).  Per
token, ``G_t = sum_{t' >= t} r_{t'}`` (reward to go) and the path-variance proxy ("realized
energy") ``W_t = sum_{j <= t} w_j`` with ``w_j = 1 - 2 pi_j + sum_v pi_v^2`` (``pi_j``: the old
policy's probability of the sampled token, ``exp(old_log_prob)``; ``sum_v pi_v^2`` from the
actor's old-log-prob forward, ``actor.calculate_sum_pi_squared``).  Within each prompt group the
baseline at step t is ``B_t = sum_i G_t^i W_t^i / (sum_i W_t^i + 1e-8)`` and ``A_t = G_t - B_t``.
A group of one response has baseline 0 (``A = G``).  As verl (its ``handle_zero_tail``, always on
there): where one response is strictly the longest of its group, its baseline is 0 past the
second-longest response's length (no other response informs those steps).

* ``optimal_token_baseline`` aligns the responses of a group by column t.
* ``tir_optimal_token_baseline`` (multi-turn, tool-integrated) aligns them by the index of the
  valid token: masked positions (tool observations) are skipped, so the k-th generated token of
  each response shares a baseline.  Empty responses are left out of their group.  For responses
  without masked holes both give the same result.

GDPO (Group reward-Decoupled normalization Policy Optimization; arXiv:2601.05242).  Each reward
component k (``algorithm.gdpo_reward_keys``: keys of the reward function's returned dict) is
GRPO-normalized within its group on its own, ``A_k = (s_k - mean_g) / (std_g + 1e-6)`` (the
``grpo`` estimator's rules, including ``norm_adv_by_std_in_grpo`` and a group of one), the
components are summed with ``algorithm.gdpo_reward_weights`` (null = all 1), and the sum is
whitened over the valid tokens of the batch.  Without components (a direct call) the single
component is the summed token reward.

Deviations from verl: advantages and returns are 0 at masked positions; groups are vectorized
(no Python loop over samples); rollout importance-sampling weights (verl's
``rollout_is_weights``) are not applied, as rlforge computes none.
"""

from __future__ import annotations

from typing import Any

import torch

from rlforge.errors import ConfigError

from .advantages import ADV_ESTIMATORS, GRPO_EPS, AdvantageInputs
from .advantages_outcome import _whiten
from .groups import group_ids, group_sum, grpo_normalized_scores, require_index
from .utils import apply_mask

OTB_EPS = 1e-8
"""Added to the denominator of the optimal token baseline (verl's value)."""



def _otb_inputs(inputs: AdvantageInputs, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mask, returns G (B, R), per-token proxy w (B, R)), 0 at masked positions."""
    if inputs.old_log_probs is None or inputs.sum_pi_squared is None:
        raise ConfigError(
            f"algorithm.adv_estimator={name!r} needs the old log-probs and sum_pi_squared of the actor's "
            "old_log_prob forward: set actor_rollout_ref.actor.calculate_sum_pi_squared=true"
        )
    rewards = inputs.token_level_rewards
    mask = inputs.response_mask.to(rewards.dtype)
    returns = apply_mask(apply_mask(rewards, mask).flip(-1).cumsum(-1).flip(-1), mask)
    w = 1.0 - 2.0 * torch.exp(inputs.old_log_probs.to(rewards.dtype)) + inputs.sum_pi_squared.to(rewards.dtype)
    return mask, returns, apply_mask(w, mask)


def _zero_tail(baseline: torch.Tensor, lengths: torch.Tensor, gid: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
    """Baseline 0 at positions >= the second-longest length, for each group's unique longest member."""
    num_groups = int(gid.max()) + 1
    len_m = torch.where(member, lengths, torch.full_like(lengths, -1.0))
    gmax = torch.full((num_groups,), -1.0, dtype=lengths.dtype, device=lengths.device)
    gmax = gmax.scatter_reduce(0, gid, len_m, "amax")
    at_max = member & (lengths == gmax[gid])
    count_at_max = group_sum(at_max.to(lengths.dtype), gid)
    below = torch.where(member & ~at_max, lengths, torch.full_like(lengths, -1.0))
    second = torch.full_like(gmax, -1.0).scatter_reduce(0, gid, below, "amax")
    cut = at_max & (count_at_max[gid] == 1) & (second[gid] >= 0)
    cols = torch.arange(baseline.shape[1], dtype=lengths.dtype, device=lengths.device).unsqueeze(0)
    zero = cut.unsqueeze(-1) & (cols >= second[gid].unsqueeze(-1))
    return torch.where(zero, torch.zeros_like(baseline), baseline)


def _optimal_baseline(returns: torch.Tensor, w_cum: torch.Tensor, valid: torch.Tensor, gid: torch.Tensor,
                      member: torch.Tensor) -> torch.Tensor:
    """``B_t = sum_i G_t W_t / (sum_i W_t + eps)`` per group and position t of the (B, L) grid, for
    the rows with ``member`` True; 0 for groups of one member and for non-members."""
    keep = valid * member.to(valid.dtype).unsqueeze(-1)
    num_groups = int(gid.max()) + 1
    zeros = returns.new_zeros(num_groups, returns.shape[1])
    num = zeros.index_add(0, gid, returns * w_cum * keep)
    den = zeros.index_add(0, gid, w_cum * keep) + OTB_EPS
    size = group_sum(member.to(returns.dtype), gid)
    baseline = (num / den)[gid]
    shared = member & (size[gid] > 1)
    baseline = torch.where(shared.unsqueeze(-1), baseline, torch.zeros_like(baseline))
    return _zero_tail(baseline, valid.sum(-1), gid, shared)


@ADV_ESTIMATORS.register("optimal_token_baseline")
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    inputs: AdvantageInputs, config: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline, single-turn (Li et al. 2026, arXiv:2602.07078; verl ``docs/algo/otb.md``):
    ``A_t = G_t - sum_i G_t^i W_t^i / (sum_i W_t^i + 1e-8)`` over the group, by column t.  See the
    module docstring for ``W`` and the tail rule.

    Needs ``inputs.old_log_probs`` and ``inputs.sum_pi_squared`` (B, R).

    Raises:
        ConfigError: without them (``actor.calculate_sum_pi_squared`` is off), or without ``index``.

    Returns:
        advantages (B, R), returns (B, R) = reward to go; both 0 at masked positions.
    """
    index = require_index(inputs.index, "optimal_token_baseline")
    mask, returns, w = _otb_inputs(inputs, "optimal_token_baseline")
    gid = group_ids(index, returns.device)
    member = torch.ones(returns.shape[0], dtype=torch.bool, device=returns.device)
    baseline = _optimal_baseline(returns, w.cumsum(-1), mask, gid, member)
    return apply_mask(returns - baseline, mask), returns


@ADV_ESTIMATORS.register("tir_optimal_token_baseline")
@torch.no_grad()
def compute_tir_optimal_token_baseline_advantage(
    inputs: AdvantageInputs, config: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline for multi-turn responses (verl's ``tir_optimal_token_baseline``;
    Li et al. 2026, arXiv:2602.07078): as ``optimal_token_baseline`` with the responses of a group
    aligned by valid-token index (the k-th generated token), skipping masked observation tokens;
    empty responses are not group members.

    Raises and returns: as ``optimal_token_baseline``.
    """
    index = require_index(inputs.index, "tir_optimal_token_baseline")
    mask, returns, w = _otb_inputs(inputs, "tir_optimal_token_baseline")
    valid = mask != 0
    lengths = valid.sum(-1)
    width = max(int(lengths.max()), 1) if lengths.numel() else 1
    rows, cols = valid.nonzero(as_tuple=True)
    k = (valid.cumsum(-1) - 1)[rows, cols]  # index of each valid token among its row's valid tokens

    def compact(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(x.shape[0], width).index_put_((rows, k), x[rows, cols])

    c_valid = compact(mask)
    gid = group_ids(index, returns.device)
    baseline = _optimal_baseline(compact(returns), compact(w).cumsum(-1) * c_valid, c_valid, gid, lengths > 0)
    advantages = torch.zeros_like(returns)
    advantages[rows, cols] = returns[rows, cols] - baseline[rows, k]
    return apply_mask(advantages, mask), returns


compute_optimal_token_baseline_advantage.needs_sum_pi_squared = True  # type: ignore[attr-defined]
compute_tir_optimal_token_baseline_advantage.needs_sum_pi_squared = True  # type: ignore[attr-defined]


@ADV_ESTIMATORS.register("gdpo")
@torch.no_grad()
def compute_gdpo_outcome_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (arXiv:2601.05242, verl's ``compute_gdpo_outcome_advantage``):
    ``A = whiten(sum_k w_k * grpo_norm(s_k))`` over the valid tokens of the batch (module docstring).

    Components: ``inputs.reward_components`` ({key: (B,) score}, in ``algorithm.gdpo_reward_keys``
    order), else the single summed token reward.  Weights: ``config.gdpo_reward_weights`` (one per
    component) or all 1.  A batch with fewer than 2 valid tokens gets advantages 0.

    Raises:
        ConfigError: without ``index``, or when the number of weights differs from the components'.

    Returns:
        advantages (B, R) and returns (B, R), the same tensor; 0 at masked positions.
    """
    index = require_index(inputs.index, "gdpo")
    mask = inputs.response_mask.to(inputs.token_level_rewards.dtype)
    comps = list(inputs.reward_components.values()) if inputs.reward_components else [
        inputs.token_level_rewards.sum(dim=-1)]
    weights = getattr(config, "gdpo_reward_weights", None)
    weights = [1.0] * len(comps) if weights is None else [float(x) for x in weights]
    if len(weights) != len(comps):
        raise ConfigError(f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(comps)} reward "
                          "components (algorithm.gdpo_reward_keys); give one weight per key")
    gid = group_ids(index, mask.device)
    norm = bool(config.norm_adv_by_std_in_grpo)
    total = torch.zeros(mask.shape[0], dtype=mask.dtype, device=mask.device)
    for wk, comp in zip(weights, comps, strict=True):
        total = total + wk * grpo_normalized_scores(comp.to(mask.dtype), gid, GRPO_EPS, norm)
    advantages = _whiten(apply_mask(total.unsqueeze(-1), mask), mask)
    return advantages, advantages


compute_gdpo_outcome_advantage.needs_reward_components = True  # type: ignore[attr-defined]

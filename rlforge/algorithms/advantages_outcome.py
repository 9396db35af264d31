"""Outcome-reward advantage estimators beyond GAE and GRPO, registered in ``ADV_ESTIMATORS``.

Names, formulas and group conventions follow verl's ``verl/trainer/ppo/core_algos.py``
(``compute_rloo_outcome_advantage``, ``compute_reinforce_plus_plus_outcome_advantage``, ...).
Every function has the signature ``fn(inputs: AdvantageInputs, config) -> (advantages, returns)``
with ``config`` the ``algorithm`` section; tensors are (B, R) with B sequences and R the
response length.  A sequence's *score* is ``s_i = sum_t token_level_rewards[i, t]``.

Deviations from verl, shared by all estimators here:
* advantages *and* returns are 0 at masked positions (verl leaves carried-over values there;
  every loss masks them anyway);
* groups are formed with one vectorized scatter instead of a Python loop over samples;
* where verl whitens over the batch (reinforce++), a batch with fewer than two valid tokens
  gets advantage 0 instead of an error from the unbiased variance.
"""

from __future__ import annotations

from typing import Any

import torch

from rlforge.errors import ConfigError

from .advantages import ADV_ESTIMATORS, GRPO_EPS, AdvantageInputs
from .groups import group_count_mean_std, group_ids, group_sum, require_index
from .utils import apply_mask, masked_whiten


def _scores_and_mask(inputs: AdvantageInputs) -> tuple[torch.Tensor, torch.Tensor]:
    mask = inputs.response_mask.to(inputs.token_level_rewards.dtype)
    return inputs.token_level_rewards.sum(dim=-1), mask


def _whiten(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``masked_whiten(values, mask) * mask``; all zeros when fewer than 2 tokens are valid."""
    if float(mask.sum()) < 2:
        return torch.zeros_like(values)
    return apply_mask(masked_whiten(values, mask), mask)


def _group_mean_singleton_zero(scores: torch.Tensor, gid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample group size and group mean (B,), with mean 0 for groups of one (verl's rule)."""
    count, mean, _ = group_count_mean_std(scores, gid)
    mean = torch.where(count == 1, torch.zeros_like(mean), mean)
    return count[gid], mean[gid]


@ADV_ESTIMATORS.register("rloo")
@torch.no_grad()
def compute_rloo_outcome_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE Leave-One-Out (Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a Baseline for
    Free!"; Ahmadian et al. 2024, arXiv:2402.14740, eq. 6).

    ``A_i = s_i - mean_{j != i} s_j`` over the other responses of i's group, computed as verl
    does: ``A_i = s_i * n / (n - 1) - mean(group) * n / (n - 1)`` with ``n`` the group size.
    A group of size 1 has no other response: its advantage is the raw score ``s_i`` (verl's
    behaviour; no division).  ``A_i`` is broadcast over the valid tokens.

    Returns:
        advantages (B, R) and returns (B, R), the same tensor.
    """
    index = require_index(inputs.index, "rloo")
    scores, mask = _scores_and_mask(inputs)
    n, mean = _group_mean_singleton_zero(scores, group_ids(index, scores.device))
    scale = torch.where(n > 1, n / (n - 1).clamp_min(1.0), torch.ones_like(n))
    adv = (scores - mean) * scale
    advantages = apply_mask(adv.unsqueeze(-1), mask)
    return advantages, advantages


@ADV_ESTIMATORS.register("reinforce_plus_plus")
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    inputs: AdvantageInputs, config: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262, §3 "token-level reward, discounted return,
    global advantage normalization").

    Backwards over t: ``G_t = r_t + gamma * G_{t+1}`` with the running return reset to 0 at
    each masked position, as verl ("reset after EOS"): nothing past EOS reaches the response,
    and in multi-turn data rewards after a masked observation span do not reach earlier turns
    either; ``returns = G``.  The advantages are ``G`` whitened over all valid tokens of
    the batch (:func:`masked_whiten`: mean and unbiased std).  No groups are used, so a group
    of size 1 is no special case; a batch with fewer than 2 valid tokens gets advantages 0.

    Config: ``gamma`` (discount per token).

    Returns:
        advantages (B, R) whitened, returns (B, R) un-whitened; both 0 at masked positions.
    """
    rewards = inputs.token_level_rewards
    mask = inputs.response_mask.to(rewards.dtype)
    gamma = float(config.gamma)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
        running = apply_mask(running, mask[:, t])
    returns = apply_mask(returns, mask)
    return _whiten(returns, mask), returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline")
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    inputs: AdvantageInputs, config: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262, the group-baseline variant in verl).

    ``a_i = s_i - mean(group)`` broadcast over the valid tokens, then whitened over all valid
    tokens of the batch (so longer responses weigh more in the batch statistics, as in verl).
    A group of size 1 uses mean 0 (verl), so ``a_i = s_i`` before whitening.

    Returns:
        advantages (B, R) and returns (B, R), the same tensor (verl returns the same too).
    """
    index = require_index(inputs.index, "reinforce_plus_plus_baseline")
    scores, mask = _scores_and_mask(inputs)
    _, mean = _group_mean_singleton_zero(scores, group_ids(index, scores.device))
    advantages = _whiten(apply_mask((scores - mean).unsqueeze(-1), mask), mask)
    return advantages, advantages


@ADV_ESTIMATORS.register("remax")
@torch.no_grad()
def compute_remax_outcome_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505, Algorithm 1 / eq. 5).

    The baseline of response i is ``b_i = reward of the greedy response to the same prompt``
    (``inputs.reward_baselines``, (B,)).  As verl: ``returns_t = sum_{t' >= t} r_{t'}`` (reward to
    go, undiscounted, over the valid tokens) and ``A_t = returns_t - b_i``.  With an outcome
    reward on the last valid token both equal ``s_i`` resp. ``s_i - b_i`` at every valid token.
    No groups are used (a group of size 1 is no special case).

    Raises:
        ConfigError: if ``inputs.reward_baselines`` is None (the trainer's ``gen_max`` stage
            must score a greedy rollout per prompt).

    Returns:
        advantages (B, R), returns (B, R) (reward to go, without the baseline); 0 where masked.
    """
    if inputs.reward_baselines is None:
        raise ConfigError(
            "algorithm.adv_estimator='remax' needs reward_baselines: the reward of a greedy rollout per "
            "prompt (the trainer's gen_max stage); pass AdvantageInputs(reward_baselines=...)"
        )
    rewards, mask = inputs.token_level_rewards, inputs.response_mask.to(inputs.token_level_rewards.dtype)
    returns = apply_mask(apply_mask(rewards, mask).flip(-1).cumsum(-1).flip(-1), mask)
    baselines = inputs.reward_baselines.to(rewards.dtype).unsqueeze(-1)
    advantages = apply_mask(returns - baselines, mask)
    return advantages, returns


# The trainer runs the extra stage gen_max (a greedy rollout per prompt) to fill reward_baselines.
compute_remax_outcome_advantage.needs_reward_baselines = True  # type: ignore[attr-defined]


@ADV_ESTIMATORS.register("opo")
@torch.no_grad()
def compute_opo_outcome_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """On-Policy RL with Optimal reward baseline (Hao et al. 2025, arXiv:2505.23585, eq. 5-6).

    Length-weighted group baseline ``b = sum_j L_j s_j / sum_j L_j`` with ``L_j`` the number of
    valid tokens of response j; ``A_i = s_i - b`` broadcast over the valid tokens.  A group of
    size 1 uses ``b = 0`` (verl), so ``A_i = s_i``; a group whose responses are all empty
    (``sum L = 0``) also gets ``b = 0`` instead of a division by zero.

    Returns:
        advantages (B, R) and returns (B, R), the same tensor.
    """
    index = require_index(inputs.index, "opo")
    scores, mask = _scores_and_mask(inputs)
    gid = group_ids(index, scores.device)
    lengths = mask.sum(dim=-1)
    count = group_sum(torch.ones_like(scores), gid)
    len_sum = group_sum(lengths, gid)
    baseline = group_sum(lengths * scores, gid) / len_sum.clamp_min(1.0)
    baseline = torch.where((count == 1) | (len_sum == 0), torch.zeros_like(baseline), baseline)
    advantages = apply_mask((scores - baseline[gid]).unsqueeze(-1), mask)
    return advantages, advantages


@ADV_ESTIMATORS.register("gpg")
@torch.no_grad()
def compute_gpg_outcome_advantage(inputs: AdvantageInputs, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546, eq. 6-7), as verl computes it.

    ``A_i = alpha * (s_i - mean(group)) / f_norm`` with ``f_norm = 1`` and
    ``alpha = B / max(M, 1)``, ``M`` = number of sequences of the batch whose score is non-zero
    (verl's ``torch.count_nonzero(scores)``; the paper's ``alpha = B / (B - M')`` counts the
    samples with zero *advantage* instead — rlforge follows verl).  A group of size 1 uses
    mean 0 (verl), so ``A_i = alpha * s_i``.  No std normalization.

    Returns:
        advantages (B, R) and returns (B, R), the same tensor.
    """
    index = require_index(inputs.index, "gpg")
    scores, mask = _scores_and_mask(inputs)
    _, mean = _group_mean_singleton_zero(scores, group_ids(index, scores.device))
    num_nonzero = float(torch.count_nonzero(scores))
    alpha = scores.shape[0] / max(num_nonzero, 1.0)
    advantages = apply_mask((alpha * (scores - mean)).unsqueeze(-1), mask)
    return advantages, advantages


@ADV_ESTIMATORS.register("grpo_passk")
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    inputs: AdvantageInputs, config: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k-style GRPO (verl's ``compute_grpo_passk_outcome_advantage``; Chen et al. 2025,
    arXiv:2503.19595).

    In each group only the best response (first one on ties) gets a non-zero advantage,
    ``A = s_max - s_second_max``, divided by ``std(group) + 1e-6`` (unbiased std) when
    ``config.norm_adv_by_std_in_grpo``; all other responses get 0.  Broadcast over the valid tokens.

    Raises:
        ConfigError: for a group of size 1 (there is no second-best response; verl raises too):
            set ``actor_rollout_ref.rollout.n >= 2``.

    Returns:
        advantages (B, R) and returns (B, R), the same tensor.
    """
    index = require_index(inputs.index, "grpo_passk")
    scores, mask = _scores_and_mask(inputs)
    gid = group_ids(index, scores.device)
    count, _, std = group_count_mean_std(scores, gid)
    if bool((count < 2).any()):
        raise ConfigError(
            "algorithm.adv_estimator='grpo_passk' needs at least 2 responses per prompt; "
            "set actor_rollout_ref.rollout.n >= 2"
        )
    # Sort by (group, score descending, position): the first row of each group is its best.
    order = torch.argsort(scores, descending=True, stable=True)
    order = order[torch.argsort(gid[order], stable=True)]
    starts = torch.cumsum(count.long(), 0) - count.long()
    best, second = order[starts], order[starts + 1]
    gap = scores[best] - scores[second]
    if config.norm_adv_by_std_in_grpo:
        gap = gap / (std + GRPO_EPS)
    adv = torch.zeros_like(scores)
    adv[best] = gap
    advantages = apply_mask(adv.unsqueeze(-1), mask)
    return advantages, advantages

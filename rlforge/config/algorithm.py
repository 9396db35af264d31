"""``algorithm.*``: advantage estimation and KL control (verl key names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KLControlConfig:
    """KL penalty coefficient controller (used when ``use_kl_in_reward``)."""

    type: str = "fixed"
    """``fixed`` | ``adaptive``."""
    kl_coef: float = 0.001
    """(Initial) KL coefficient."""
    horizon: int = 10000
    """Adaptive controller horizon (steps)."""
    target_kl: float = 0.1
    """Adaptive controller target KL (nats per token)."""


@dataclass
class PFPPOConfig:
    """Preference-feedback PPO sample reweighting."""

    reweight_method: str = "pow"
    """``pow`` | ``max_min`` | ``max_random``."""
    weight_pow: float = 2.0
    """Exponent for ``pow``."""


@dataclass
class FilterGroupsConfig:
    """DAPO dynamic sampling: drop groups whose responses all score the same."""

    enable: bool = False
    """Turn the filter on."""
    metric: str | None = None
    """Per-response metric compared within a group (``acc``, ``score``, ``seq_reward``); None = ``seq_reward``."""
    max_num_gen_batches: int = 0
    """Give up after this many generation batches per step; 0 = no limit."""
    proceed_on_limit: bool = False
    """rlforge addition: at ``max_num_gen_batches``, train on the groups kept so far instead of
    stopping with an error (verl always stops)."""


@dataclass
class RolloutCorrectionConfig:
    """verl's ``algorithm.rollout_correction``: importance weights and rejection masks between the
    rollout's own log-probs (``rollout_log_probs``) and the trainer's (:mod:`rlforge.algorithms.rollout_correction`;
    docs/algorithms.md).  Off (``rollout_is``, ``rollout_rs`` null and ``bypass_mode`` false, the
    defaults of verl's YAML): the loss is untouched.  On: ``rollout.calculate_log_probs`` is turned on."""

    rollout_is: str | None = None
    """Truncated importance weights ``min(pi_old / pi_rollout, rollout_is_threshold)`` that multiply the
    policy loss per token: ``token`` (one per token) | ``sequence`` (the product over the response,
    one per sequence) | null (none)."""
    rollout_is_threshold: float | None = 2.0
    """Upper bound of the importance weights (> 0; verl suggests 1.5-5 for token, 2-10 for sequence); null
    only with ``rollout_is`` null (verl's scripts write both null to turn the weights off)."""
    rollout_is_batch_normalize: bool = False
    """Divide the truncated weights by their batch mean (token level: over tokens; sequence level:
    over sequences), so they average 1."""
    rollout_rs: str | None = None
    """Rejection: comma-separated criteria, all must pass, failing tokens/sequences leave
    ``response_mask``: ``token_k1|k2|k3``, ``seq_sum_k1|k2|k3``, ``seq_mean_k1|k2|k3``,
    ``seq_max_k2|k3`` (k1 = log-ratio, k2 = 0.5 log^2, k3 = r - 1 - log r); null = none."""
    rollout_rs_threshold: Any = None
    """Threshold(s) of ``rollout_rs``, one per criterion (comma-separated) or one for all: ``k1``
    criteria take ``lower_upper`` ratio bounds (``"0.5_2.0"``; one number ``u`` means ``1/u_u``),
    ``k2``/``k3`` one positive upper bound.  A string or a number; needed when ``rollout_rs`` is set."""
    bypass_mode: bool = False
    """True: the rollout's log-probs are the old log-probs (no ``old_log_prob`` forward; 2 policies);
    weights and masks are computed per micro-batch against the policy being trained.  False: decoupled
    (3 policies; the weights compare the recomputed old log-probs with the rollout's)."""
    loss_type: str = "ppo_clip"
    """Loss under ``bypass_mode``: ``ppo_clip`` (PPO's clipped ratio against the rollout policy;
    importance weights not applied) | ``reinforce`` (``-w * A * log pi``, w the truncated weights)."""


@dataclass
class AlgorithmConfig:
    """Advantage estimator and KL-in-reward settings."""

    gamma: float = 1.0
    """Discount factor per token."""
    lam: float = 1.0
    """GAE lambda."""
    adv_estimator: str = "gae"
    """Advantage-estimator registry name: ``gae`` | ``grpo`` | ``rloo`` | ``reinforce_plus_plus`` |
    ``reinforce_plus_plus_baseline`` | ``remax`` | ``opo`` | ``gpg`` | ``grpo_passk`` | ``gdpo`` |
    ``optimal_token_baseline`` | ``tir_optimal_token_baseline`` (these two need
    ``actor.calculate_sum_pi_squared=true``)."""
    norm_adv_by_std_in_grpo: bool = True
    """Divide GRPO (and ``grpo_passk``) advantages by the group std.  False together with
    ``actor.loss_agg_mode=seq-mean-token-sum-norm`` = Dr.GRPO."""
    gdpo_reward_keys: list[str] | None = None
    """``adv_estimator=gdpo`` (required there): the reward components to normalize one by one, keys of the
    dict the reward function returns (e.g. ``[accuracy_reward, format_reward]``); null = unset."""
    gdpo_reward_weights: list[float] | None = None
    """``adv_estimator=gdpo``: one weight per ``gdpo_reward_keys`` entry in the sum of the normalized
    components; null = all 1."""
    use_kl_in_reward: bool = False
    """Subtract a KL(actor || ref) penalty from token rewards."""
    kl_penalty: str = "kl"
    """KL estimator for that penalty: ``kl`` | ``abs`` | ``mse`` | ``low_var_kl`` | ``full``."""
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    """KL coefficient controller."""
    use_pf_ppo: bool = False
    """Reweight samples by reward (PF-PPO)."""
    pf_ppo: PFPPOConfig = field(default_factory=PFPPOConfig)
    """PF-PPO settings."""
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    """DAPO dynamic sampling."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Rollout correction (importance weights, rejection masks, bypass mode)."""

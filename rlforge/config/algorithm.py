"""``algorithm.*``: advantage estimation and KL control (verl key names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field


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

"""RL algorithm pieces: advantage estimators, policy/value losses, KL, loss aggregation.

Each pluggable family is a :class:`rlforge.registry.Registry` keyed by its verl config key:
``ADV_ESTIMATORS`` (``algorithm.adv_estimator``), ``POLICY_LOSSES``
(``actor_rollout_ref.actor.policy_loss.loss_mode``), ``KL_ESTIMATORS``
(``algorithm.kl_penalty`` / ``actor.kl_loss_type``), ``LOSS_AGG_MODES`` (``*.loss_agg_mode``)
and ``KL_CONTROLLERS`` (``algorithm.kl_ctrl.type``).  Importing this package registers every
entry (the modules below register on import).
"""

from rlforge.config.registry_names import OTB_ESTIMATORS

from .advantages import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
)
from .advantages_otb import (
    compute_gdpo_outcome_advantage,
    compute_optimal_token_baseline_advantage,
    compute_tir_optimal_token_baseline_advantage,
)
from .advantages_outcome import (
    compute_gpg_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from .aggregation import LOSS_AGG_MODES, agg_loss, loss_agg_globals, num_valid_seqs
from .entropy import entropy_from_logits
from .flowrl import FLOWRL_REWARDS, compute_policy_loss_flowrl, flowrl_reward_target
from .kl import (
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    build_kl_controller,
    kl_loss,
    kl_penalty,
)
from .loss_hooks import ExtraModules, PolicyLossHooks, loss_hooks, with_hooks
from .policy_losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossOutput,
    compute_policy_loss,
    compute_policy_loss_vanilla,
)
from .policy_losses_cov import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from .policy_losses_dppo import (
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
)
from .policy_losses_extra import (
    compute_policy_loss_cispo,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
)
from .utils import apply_mask, masked_mean, masked_sum, masked_var, masked_whiten
from .value_loss import compute_value_loss

__all__ = [
    "ExtraModules", "PolicyLossHooks", "loss_hooks", "with_hooks",
    "ADV_ESTIMATORS",
    "FLOWRL_REWARDS",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "AdvantageInputs",
    "FixedKLController",
    "PolicyLossInputs",
    "PolicyLossOutput",
    "agg_loss",
    "apply_kl_penalty",
    "build_kl_controller",
    "compute_advantage",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_tir_optimal_token_baseline_advantage",
    "OTB_ESTIMATORS",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_flowrl",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "flowrl_reward_target",
    "kl_loss",
    "kl_penalty",
    "loss_agg_globals",
    "apply_mask",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "num_valid_seqs",
]

"""RL algorithm pieces: advantage estimators, policy/value losses, KL, loss aggregation.

Each pluggable family is a :class:`rlforge.registry.Registry` keyed by its verl config key:
``ADV_ESTIMATORS`` (``algorithm.adv_estimator``), ``POLICY_LOSSES``
(``actor_rollout_ref.actor.policy_loss.loss_mode``), ``KL_ESTIMATORS``
(``algorithm.kl_penalty`` / ``actor.kl_loss_type``), ``LOSS_AGG_MODES`` (``*.loss_agg_mode``)
and ``KL_CONTROLLERS`` (``algorithm.kl_ctrl.type``).
"""

from .advantages import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    compute_advantage,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
)
from .aggregation import LOSS_AGG_MODES, agg_loss, loss_agg_globals, num_valid_seqs
from .entropy import entropy_from_logits
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
from .policy_losses import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossOutput,
    compute_policy_loss,
    compute_policy_loss_vanilla,
)
from .utils import masked_mean, masked_sum, masked_var, masked_whiten
from .value_loss import compute_value_loss

__all__ = [
    "ADV_ESTIMATORS",
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
    "compute_grpo_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_vanilla",
    "compute_value_loss",
    "entropy_from_logits",
    "kl_loss",
    "kl_penalty",
    "loss_agg_globals",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "num_valid_seqs",
]

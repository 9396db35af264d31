"""The names of the registries a config selects from, without importing the registries.

The registries themselves (:data:`rlforge.algorithms.ADV_ESTIMATORS`, ``POLICY_LOSSES``,
``KL_ESTIMATORS``, :data:`rlforge.rewards.REWARD_MANAGERS`) live beside their torch code;
importing them costs torch's start-up (seconds on a busy machine).  Validation checks a config
against these lists instead, so a wrong name is reported before torch loads, with the message
:meth:`rlforge.registry.Registry.get` gives.  ``tests/config/test_registry_names.py`` checks that
each list equals its registry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlforge.registry import unknown_name


@dataclass(frozen=True)
class RegistryNames:
    """The names of one registry: ``kind`` and ``config_key`` as the registry has them."""

    kind: str
    config_key: str
    names: tuple[str, ...]

    def check(self, name: object) -> None:
        """Raises ConfigError (as the registry's ``get`` does) when ``name`` is not registered."""
        if name not in self.names:
            raise unknown_name(self.kind, self.config_key, name, self.names)


ADV_ESTIMATORS = RegistryNames("advantage estimator", "algorithm.adv_estimator", (
    "gae", "gdpo", "gpg", "grpo", "grpo_passk", "opo", "optimal_token_baseline", "reinforce_plus_plus",
    "reinforce_plus_plus_baseline", "remax", "rloo", "tir_optimal_token_baseline"))
OTB_ESTIMATORS = ("optimal_token_baseline", "tir_optimal_token_baseline")
"""The estimators that read the old policy's sum of squared probabilities (``calculate_sum_pi_squared``)."""
POLICY_LOSSES = RegistryNames("policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode", (
    "cispo", "clip_cov", "dppo_kl", "dppo_tv", "dro", "flowrl", "geo_mean", "gpg", "gspo", "kl_cov", "sapo",
    "vanilla"))
_KL = ("abs", "k1", "k2", "k3", "kl", "low_var_kl", "mse")
KL_ESTIMATORS = RegistryNames("KL estimator", "algorithm.kl_penalty or actor_rollout_ref.actor.kl_loss_type",
                              tuple(sorted((*_KL, *(f"{k}+" for k in _KL)))))
LOSS_AGG_MODES = RegistryNames("loss aggregation mode", "actor_rollout_ref.actor.loss_agg_mode or critic.loss_agg_mode",
                               ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
KL_CONTROLLERS = RegistryNames("KL controller", "algorithm.kl_ctrl.type", ("fixed", "adaptive"))
REWARD_MANAGERS = RegistryNames("reward manager", "reward_model.reward_manager", ("batch", "dapo", "naive", "prime"))


def flowrl_uses_ref(actor_cfg: Any) -> bool:
    """FlowRL's reference forward: on unless ``policy_loss.flowrl.use_ref`` is false."""
    return bool(actor_cfg.policy_loss.flowrl.use_ref)


LOSSES_NEEDING_REF: dict[str, Callable[[Any], bool]] = {"flowrl": flowrl_uses_ref}
"""Policy loss -> ``(actor config) -> bool``: the loss's ``needs_ref_log_prob`` hook
(:class:`rlforge.algorithms.loss_hooks.PolicyLossHooks`, which the loss registers with exactly
this function); a loss not listed never asks for the reference."""

"""Optional hooks of a policy loss: what the job must build or compute for it beyond the plain
log-probs (a head on the policy, a reference forward, per-row targets over the whole batch).

A loss registered in :data:`~rlforge.algorithms.policy_losses.POLICY_LOSSES` declares them with
:func:`with_hooks`; the builder and the actor read them through :func:`loss_hooks` and never branch
on the loss's name.  A loss without hooks gets :class:`PolicyLossHooks`' defaults (nothing extra).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

ParamGroups = list[tuple[Callable[[str], bool], float]]
"""``[(name predicate, learning-rate multiplier)]``, see :data:`rlforge.engine.sharded.ParamGroupSpec`."""


@dataclass(frozen=True)
class ExtraModules:
    """The policy as trained, with the modules a loss adds.

    Attributes:
        module: the module the actor's engine trains (e.g. the LM wrapped with a head).
        param_groups: learning-rate groups of the added parameters (None = one group).
        lm_prefix: the state-dict prefix of the causal LM inside ``module`` (``""`` = ``module``
            is the LM itself), e.g. ``"lm."``; the rollout generates with that submodule.
    """

    module: torch.nn.Module
    param_groups: ParamGroups | None = None
    lm_prefix: str = ""

    def lm_of(self, copy: torch.nn.Module) -> torch.nn.Module:
        """The causal LM inside ``copy`` (a copy of :attr:`module`)."""
        return copy.get_submodule(self.lm_prefix.rstrip(".")) if self.lm_prefix else copy


LossForward = Callable[[torch.nn.Module, Any, float, bool, int],
                       tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]]
"""``forward(module, micro_batch, temperature, with_entropy, chunk_size) -> (log_probs (B, R),
entropy (B, R) or None, extra PolicyLossInputs fields by name)`` of the training forward."""


@dataclass(frozen=True)
class PolicyLossHooks:
    """Every field optional; the defaults add nothing.

    Attributes:
        needs_ref_log_prob: ``(actor config) -> bool``: the reference policy's log-probs are
            computed for this loss (``ref_log_prob``).
        extra_modules: ``(actor config, causal LM) -> ExtraModules``: wrap the policy before its
            engine is built (a head, its learning rate).
        forward: the training forward (:data:`LossForward`) replacing the plain log-probs, for a
            module built by ``extra_modules``.
        batch_inputs: ``(actor config, token_level_rewards (B, R) or None, uids (B,) or None) ->
            {name: (B,) tensor}``: per-row values computed over the whole batch before it is split
            into micro-batches, handed to the loss in ``PolicyLossInputs.extra``.
        exports_extra_modules: ``(actor config) -> bool``: the ``hf_model`` export writes the extra
            modules' weights beside the LM (``<module name>.safetensors``).
        frozen_keys: config keys that decide the extra modules' shapes (a resumed run must keep them).
    """

    needs_ref_log_prob: Callable[[Any], bool] | None = None
    extra_modules: Callable[[Any, torch.nn.Module], ExtraModules] | None = None
    forward: LossForward | None = None
    batch_inputs: Callable[[Any, torch.Tensor | None, np.ndarray | None], dict[str, torch.Tensor]] | None = None
    exports_extra_modules: Callable[[Any], bool] | None = None
    frozen_keys: tuple[str, ...] = ()

    def wants_ref(self, actor_cfg: Any) -> bool:
        """Whether the loss asks for the reference log-probs under ``actor_cfg``."""
        return bool(self.needs_ref_log_prob(actor_cfg)) if self.needs_ref_log_prob is not None else False

    def exports_extras(self, actor_cfg: Any) -> bool:
        """Whether the ``hf_model`` export writes the extra modules (False without the hook)."""
        return bool(self.exports_extra_modules(actor_cfg)) if self.exports_extra_modules is not None else False

    def build_modules(self, actor_cfg: Any, lm: torch.nn.Module) -> ExtraModules:
        """:attr:`extra_modules`, or ``lm`` alone."""
        return self.extra_modules(actor_cfg, lm) if self.extra_modules is not None else ExtraModules(lm)


NO_HOOKS = PolicyLossHooks()


def with_hooks(hooks: PolicyLossHooks) -> Callable[[Callable], Callable]:
    """Decorator attaching ``hooks`` to a policy-loss function (apply it before registering)."""

    def deco(fn: Callable) -> Callable:
        fn.hooks = hooks  # type: ignore[attr-defined]
        return fn

    return deco


def loss_hooks(loss_fn: Callable) -> PolicyLossHooks:
    """The hooks of a registered policy-loss function (:data:`NO_HOOKS` when it has none)."""
    return getattr(loss_fn, "hooks", NO_HOOKS)

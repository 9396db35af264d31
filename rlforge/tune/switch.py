"""Switching the probed levers at run time, on built engines (issue 39, :mod:`rlforge.tune.inprocess`).

The token budgets are the roles' :class:`~rlforge.roles.common.MicroBudget` (read at each stage);
gradient checkpointing is the flag of the decoder layers' :class:`~rlforge.engine.activation.LayerWrapper`
(the builders put them in, switchable, when the tuner owns the key in a single process:
:func:`rlforge.trainer.backoff.may_switch_checkpointing`); FSDP2's ``reshard_after_forward`` is
``set_reshard_after_forward`` on each decoder layer (the root unit keeps its own setting).  The engines
follow the config: :func:`use_levers` writes the user's free keys, :func:`sync_runtime` reads them back
into the engines, so a key the user set is never switched.
"""

from __future__ import annotations

from typing import Any

from rlforge.config.common import get_key
from rlforge.engine.activation import LayerWrapper, decoder_layers, switch_checkpointing
from rlforge.tune.apply import apply_levers
from rlforge.tune.levers import Levers

_ARR = "actor_rollout_ref"
_BUDGET_KEYS = {  # (role attribute, budget attribute) -> the key it follows
    ("actor", "train_budget"): f"{_ARR}.actor.ppo_max_token_len_per_gpu",
    ("actor", "budget"): f"{_ARR}.rollout.log_prob_max_token_len_per_gpu",
    ("reference", "budget"): f"{_ARR}.ref.log_prob_max_token_len_per_gpu",
    ("critic", "budget"): "critic.ppo_max_token_len_per_gpu",
    ("critic", "forward_budget"): "critic.forward_max_token_len_per_gpu",
}
_CKPT_KEYS = {"actor": f"{_ARR}.model.enable_gradient_checkpointing",
              "critic": "critic.model.enable_gradient_checkpointing"}
_RESHARD_KEYS = {"actor": f"{_ARR}.actor.fsdp_config.reshard_after_forward",
                 "reference": f"{_ARR}.ref.fsdp_config.reshard_after_forward",
                 "critic": "critic.model.fsdp_config.reshard_after_forward"}


def _roles(job: Any) -> dict[str, Any]:
    return {name: r for name in ("actor", "reference", "critic") if (r := getattr(job, name, None)) is not None}


def _fsdp2_layers(engine: Any) -> list[Any]:
    """The decoder layers of an FSDP2 engine's module that are FSDP units (empty elsewhere)."""
    from torch.distributed.fsdp import FSDPModule

    module = getattr(engine, "module", None)
    if module is None:
        return []
    try:
        layers = decoder_layers(module)
    except ValueError:
        return []
    return [m for m in layers if isinstance(m, FSDPModule)]


def switchable(job: Any) -> set[str]:
    """The levers of :data:`PROBED` that ``job``'s actor can switch now: the budgets always,
    checkpointing where its layers carry wrappers, resharding on FSDP2."""
    module = job.actor.engine.module
    out = {"token_budget", "log_prob_budget"}
    if any(isinstance(m, LayerWrapper) for m in module.modules()):
        out.add("checkpointing")
    if _fsdp2_layers(job.actor.engine):
        out.add("reshard")
    return out


def sync_runtime(cfg: Any, job: Any) -> None:
    """Make ``job``'s engines follow ``cfg``'s budget, checkpointing and reshard keys (those that
    the engines can switch; a budget without dynamic batching stays a row count)."""
    roles = _roles(job)
    for (role, attr), key in _BUDGET_KEYS.items():
        budget = getattr(roles.get(role), attr, None)
        if budget is not None and budget.max_token_len is not None:
            budget.max_token_len = int(get_key(cfg, key))
    for role, key in _CKPT_KEYS.items():
        if role in roles and getattr(roles[role], "engine", None) is not None:
            engine = roles[role].engine
            if hasattr(engine, "module"):
                switch_checkpointing(engine.module, bool(get_key(cfg, key)))
    seen: set[int] = set()  # a LoRA reference is the actor's module seen through a view: the actor's key
    for role, key in _RESHARD_KEYS.items():
        engine = getattr(roles.get(role), "engine", None)
        module = getattr(engine, "module", None)
        if module is None or id(module) in seen:
            continue
        seen.add(id(module))
        for layer in _fsdp2_layers(engine):
            layer.set_reshard_after_forward(bool(get_key(cfg, key)), recurse=False)


def use_levers(cfg: Any, job: Any, lev: Levers) -> None:
    """Write ``lev`` into the keys the user left free and switch the engines to them."""
    apply_levers(cfg, lev)
    sync_runtime(cfg, job)

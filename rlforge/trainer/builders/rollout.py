"""The rollout: the backend that generates with the policy's own copy of the weights, and the
sync that refreshes that copy from the actor's engine after every update."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlforge.config.rollout_correction_check import is_enabled as rollout_correction_on
from rlforge.config.rollout_tp import rollout_tp_size
from rlforge.errors import ConfigError
from rlforge.models.lora import adapted_names, merged_params
from rlforge.rollout import ROLLOUTS, Rollout
from rlforge.rollout.multi_turn.setup import maybe_multi_turn
from rlforge.rollout.native.tensor_parallel import copy_sliced
from rlforge.trainer import spmd
from rlforge.trainer.builders.context import BuildContext
from rlforge.trainer.builders.engines import autocast_dtype
from rlforge.trainer.builders.policy import Policy


@dataclass(frozen=True)
class RolloutParts:
    """Attributes:
        rollout: the generation backend (wrapped by the agent loop with ``rollout.multi_turn.enable``).
        sync: ``() -> None``: make the actor's new weights visible to the rollout.
        shapes: ``{name: full shape}`` of the rollout model's state dict (taken before a
            tensor-parallel rollout shards it; the checkpoint restore checks against them).
    """

    rollout: Rollout
    sync: Callable[[], None]
    shapes: dict[str, tuple[int, ...]]


def rollout_name(cfg: Any, module: torch.nn.Module) -> str:
    """``rollout.name``; verl's ``vllm``/``sglang`` run as ``native`` where the model is one the
    native runner reproduces (Llama/Qwen family), with one model copy per GPU whatever
    ``tensor_model_parallel_size`` says (a warning says so), otherwise as ``hf``."""
    from rlforge.rollout.native.model_runner import unsupported_reason

    r = cfg.actor_rollout_ref.rollout
    if r.name in ROLLOUTS:
        return r.name
    return "native" if unsupported_reason(module) is None else "hf"


def eos_ids(tokenizer: Any, module: torch.nn.Module) -> list[int]:
    """The tokenizer's EOS id, then the model's ``generation_config.eos_token_id`` ones, deduplicated."""
    ids: list[int] = []
    gen_eos = getattr(getattr(module, "generation_config", None), "eos_token_id", None)
    for e in [tokenizer.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])]:
        if e is not None and int(e) not in ids:
            ids.append(int(e))
    return ids


def rollout_sync(policy: Policy, slices: dict[str, Any] | None = None) -> Callable[[], None]:
    """The weight sync of ``policy``'s rollout copy: every tensor gathered from the shards one at a
    time (bounded memory); with LoRA only the adapted layers, each merged (``W + scaling * B @ A``).
    ``slices``: the rollout model's tensors this rank holds a slice of (a tensor-parallel
    rollout, :meth:`Rollout.weight_slices`): each rank copies only its slice of those."""
    engine, lora = policy.actor.engine, policy.lora
    lm_slices = dict(slices or {})
    copy_slices = {policy.lm_prefix + k: v for k, v in lm_slices.items()}  # names in the engine's module

    def sync() -> None:
        if lora is None and not copy_slices:
            engine.sync_to(policy.rollout_copy)
        elif lora is None:
            with engine.phase():
                copy_sliced(engine.full_params_iter(), policy.rollout_copy, copy_slices)
        else:
            full = engine.full_params_iter(keep=adapted_names(lora, policy.lm_prefix))
            copy_sliced(merged_params(full, lora, policy.lm_prefix), policy.rollout_model, lm_slices)

    return sync


class _RolloutView:
    """``rollout.*`` as the backend sees it: the name it runs as and the tensor-parallel size it uses
    (:func:`rlforge.config.rollout_tp.rollout_tp_size`: verl's vllm/sglang names keep a size the user set)."""

    def __init__(self, node: Any, name: str, tp: int) -> None:
        self._node, self.name, self.tensor_model_parallel_size = node, name, tp

    def __getattr__(self, key: str) -> Any:
        return getattr(self._node, key)


def check_tp_rollout(cfg: Any, rollout: Rollout) -> None:
    """Raises ConfigError (one line) for what a tensor-parallel rollout does not run with: the agent
    loop (``rollout.multi_turn.enable``) and dynamic sampling (``algorithm.filter_groups.enable``,
    whose full ranks skip generation while the others generate)."""
    if not rollout.collective:
        return
    tp = f"actor_rollout_ref.rollout.tensor_model_parallel_size={cfg.actor_rollout_ref.rollout.tensor_model_parallel_size}"
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        raise ConfigError(f"actor_rollout_ref.rollout.multi_turn.enable=true runs with {tp} only at size 1 in this "
                          "build; set actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    if cfg.algorithm.filter_groups.enable:
        raise ConfigError(f"algorithm.filter_groups.enable=true runs with {tp} only at size 1 in this build; set "
                          "actor_rollout_ref.rollout.tensor_model_parallel_size=1")


def build_rollout(ctx: BuildContext, policy: Policy) -> RolloutParts:
    """The ``rollout.name`` backend on ``policy``'s rollout copy (moved to the device) and its sync;
    a LoRA adapter loaded from ``model.lora_adapter_path`` (not zero) is merged in at once.  With
    ``algorithm.rollout_correction`` on, ``rollout.calculate_log_probs`` is turned on (in ``cfg``).

    Raises ConfigError: rollout correction on a backend that returns no log-probs (hf)."""
    cfg = ctx.cfg
    arr = cfg.actor_rollout_ref
    model = policy.rollout_model
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    name = rollout_name(cfg, model)
    if rollout_correction_on(cfg.algorithm.rollout_correction):  # it needs the rollout's log-probs
        if name != "native":
            raise ConfigError(f"algorithm.rollout_correction needs the rollout's own log-probs, but rollout.name="
                              f"{arr.rollout.name} runs as {name} for this model, which does not return them")
        arr.rollout.calculate_log_probs = True
    rollout = ROLLOUTS.get(name).from_config(
        model, eos_ids(ctx.tokenizer, policy.lm), ctx.tokenizer.pad_token_id, ctx.device,
        autocast_dtype(ctx.device), _RolloutView(arr.rollout, name, rollout_tp_size(cfg, spmd.world()[1])),
    )  # a tensor-parallel native rollout shards `model` in place, before it moves to the device
    policy.rollout_copy.to(ctx.device)
    check_tp_rollout(cfg, rollout)
    rollout = maybe_multi_turn(rollout, cfg, ctx.tokenizer)  # rollout.multi_turn.enable: the agent loop
    sync = rollout_sync(policy, rollout.weight_slices())
    if policy.lora is not None and arr.model.lora_adapter_path:
        sync()
    return RolloutParts(rollout, sync, shapes)

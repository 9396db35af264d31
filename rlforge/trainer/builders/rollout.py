"""The rollout: the backend that generates with the policy's own copy of the weights, and the
sync that refreshes that copy from the actor's engine after every update."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlforge.config.rollout_correction_check import is_enabled as rollout_correction_on
from rlforge.engine.base import copy_full_params
from rlforge.errors import ConfigError
from rlforge.models.lora import adapted_names, merged_params
from rlforge.rollout import ROLLOUTS, Rollout
from rlforge.rollout.multi_turn.setup import maybe_multi_turn
from rlforge.trainer.builders.context import BuildContext
from rlforge.trainer.builders.engines import autocast_dtype
from rlforge.trainer.builders.policy import Policy


@dataclass(frozen=True)
class RolloutParts:
    """Attributes:
        rollout: the generation backend (wrapped by the agent loop with ``rollout.multi_turn.enable``).
        sync: ``() -> None``: make the actor's new weights visible to the rollout.
    """

    rollout: Rollout
    sync: Callable[[], None]


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


def rollout_sync(policy: Policy) -> Callable[[], None]:
    """The weight sync of ``policy``'s rollout copy: every tensor gathered from the shards one at a
    time (bounded memory); with LoRA only the adapted layers, each merged (``W + scaling * B @ A``)."""
    engine, lora = policy.actor.engine, policy.lora

    def sync() -> None:
        if lora is None:
            engine.sync_to(policy.rollout_copy)
            return
        full = engine.full_params_iter(keep=adapted_names(lora, policy.lm_prefix))
        copy_full_params(merged_params(full, lora, policy.lm_prefix), policy.rollout_model)

    return sync


def build_rollout(ctx: BuildContext, policy: Policy) -> RolloutParts:
    """The ``rollout.name`` backend on ``policy``'s rollout copy (moved to the device) and its sync;
    a LoRA adapter loaded from ``model.lora_adapter_path`` (not zero) is merged in at once.  With
    ``algorithm.rollout_correction`` on, ``rollout.calculate_log_probs`` is turned on (in ``cfg``).

    Raises ConfigError: rollout correction on a backend that returns no log-probs (hf)."""
    cfg = ctx.cfg
    arr = cfg.actor_rollout_ref
    policy.rollout_copy.to(ctx.device)
    model = policy.rollout_model
    name = rollout_name(cfg, model)
    if rollout_correction_on(cfg.algorithm.rollout_correction):  # it needs the rollout's log-probs
        if name != "native":
            raise ConfigError(f"algorithm.rollout_correction needs the rollout's own log-probs, but rollout.name="
                              f"{arr.rollout.name} runs as {name} for this model, which does not return them")
        arr.rollout.calculate_log_probs = True
    rollout = ROLLOUTS.get(name).from_config(
        model, eos_ids(ctx.tokenizer, policy.lm), ctx.tokenizer.pad_token_id, ctx.device,
        autocast_dtype(ctx.device), arr.rollout,
    )
    rollout = maybe_multi_turn(rollout, cfg, ctx.tokenizer)  # rollout.multi_turn.enable: the agent loop
    sync = rollout_sync(policy)
    if policy.lora is not None and arr.model.lora_adapter_path:
        sync()
    return RolloutParts(rollout, sync)

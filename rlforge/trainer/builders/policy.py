"""The policy: its causal LM (:func:`load_policy_lm`) and the trained actor with the rollout's own
copy of the weights (:func:`build_policy`)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch

from rlforge.algorithms import POLICY_LOSSES, loss_hooks
from rlforge.config.lora import lora_enabled, lora_strategy
from rlforge.engine.varlen import maybe_select_varlen
from rlforge.errors import ConfigError
from rlforge.models import load_causal_lm
from rlforge.models.lora import LoraPlan, apply_lora
from rlforge.roles.actor import Actor
from rlforge.trainer import spmd
from rlforge.trainer.backoff import may_switch_checkpointing
from rlforge.trainer.builders.context import BuildContext
from rlforge.trainer.builders.engines import (
    engine_name,
    fused_kernels_key,
    head_chunk_size,
    make_engine,
    packs,
    prefix_grouper,
    rollout_weights_dtype,
)


@dataclass(frozen=True)
class PolicyLM:
    """The policy's causal LM, prepared for every copy of it (varlen attention, liger kernels), and
    whether the actor's micro-batches share prompts (``actor.use_prefix_grouper``)."""

    module: torch.nn.Module
    share_prompts: bool


@dataclass(frozen=True)
class Policy:
    """Attributes:
        actor: the trained role (its engine owns the sharded weights).
        lm: the causal LM inside the actor's module (sharded in place by the engine).
        rollout_copy: the rollout's full copy of what ``sync`` refreshes, in the compute dtype:
            the engine's module (with a loss's extra modules) or, with LoRA, the plain base LM.
        rollout_model: the causal LM inside ``rollout_copy`` (what generates).
        lm_prefix: state-dict prefix of the LM inside the engine's module (``""`` = the LM).
        lora: the actor's LoRA adapter (``model.lora_rank > 0``), else None.
    """

    actor: Actor
    lm: torch.nn.Module
    rollout_copy: torch.nn.Module
    rollout_model: torch.nn.Module
    lm_prefix: str
    lora: LoraPlan | None


def check_context_length(cfg: Any, module: torch.nn.Module) -> None:
    """The longest sequence (prompt + response) must fit the model's ``max_position_embeddings``."""
    c = getattr(module.config, "text_config", None) or module.config
    limit = getattr(c, "max_position_embeddings", None)
    longest = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    if limit and longest > int(limit):
        raise ConfigError(
            f"data.max_prompt_length + data.max_response_length = {longest} is longer than the model's "
            f"max_position_embeddings={limit} ({cfg.actor_rollout_ref.model.path}); lower data.max_response_length"
        )


def load_policy_lm(ctx: BuildContext) -> PolicyLM:
    """``actor_rollout_ref.model`` loaded (seeded) and checked, with varlen attention and liger
    kernels applied before any copy (reference, rollout) is taken, so that all copies agree."""
    cfg, arr = ctx.cfg, ctx.cfg.actor_rollout_ref
    module = load_causal_lm(arr.model.path, ctx.tokenizer, dict(arr.model.override_config or {}), seed=ctx.seed)
    check_context_length(cfg, module)
    packed = bool(arr.model.use_remove_padding) and packs(lora_strategy(arr.actor.strategy, arr.model))
    maybe_select_varlen(module, ctx.device, bool(arr.model.use_remove_padding) and packs(arr.actor.strategy),
                        arr.model.override_config)
    if arr.model.use_liger:
        from rlforge.engine.liger import apply_liger

        apply_liger(module, ctx.device)
    share = prefix_grouper(module, packed, arr.actor.use_prefix_grouper, int(arr.rollout.n))
    return PolicyLM(module, share)


def build_policy(ctx: BuildContext, lm: PolicyLM) -> Policy:
    """The actor around ``lm`` (LoRA, the policy loss's extra modules, the engine) and the rollout's
    copy, taken before the engine shards the module (the rollout generates with a full copy,
    refreshed from the shards after every update)."""
    arr = ctx.cfg.actor_rollout_ref
    module, lora, rollout_copy = lm.module, None, None
    if lora_enabled(arr.model):  # the rollout's copy is the base model (the adapter merged in on every sync)
        rollout_copy = copy.deepcopy(module).to(dtype=rollout_weights_dtype(ctx.device))
        lora = apply_lora(module, arr.model, "actor_rollout_ref.model", str(arr.model.path), seed=ctx.seed)
    extras = loss_hooks(POLICY_LOSSES.get(arr.actor.policy_loss.loss_mode)).build_modules(arr.actor, module)
    if rollout_copy is None:
        rollout_copy = copy.deepcopy(extras.module).to(dtype=rollout_weights_dtype(ctx.device))
        rollout_model = extras.lm_of(rollout_copy)
    else:
        rollout_model = rollout_copy
    engine = make_engine(
        engine_name(lora_strategy(arr.actor.strategy, arr.model)), extras.module, ctx.device,
        fsdp_config=arr.actor.fsdp_config, optim_cfg=arr.actor.optim, total_steps=ctx.total_steps,
        optim_key="actor_rollout_ref.actor.optim", grad_clip=arr.actor.grad_clip, param_groups=extras.param_groups,
        model_cfg=arr.model, megatron_config=arr.actor.megatron, role_key="actor_rollout_ref.actor",
        compile_layers=bool(arr.actor.use_torch_compile), share_prompts=lm.share_prompts,
        trainable_state_only=lora is not None,  # checkpoints hold the adapter and its optimizer state
        switchable_checkpointing=may_switch_checkpointing(  # online back-off may turn it on
            ctx.cfg, "actor_rollout_ref.model.enable_gradient_checkpointing", spmd.world()[1]),
    )
    actor = Actor(engine, arr.actor, ctx.sizes["actor_mini"], ctx.sizes["actor_micro"], ctx.sizes["log_prob_micro"],
                  max_token_len=ctx.budgets["actor"], log_prob_max_token_len=ctx.budgets["log_prob"],
                  remove_padding=bool(arr.model.use_remove_padding) and engine.packed_forward,
                  head_chunk_size=head_chunk_size(
                      arr.actor.use_fused_kernels, arr.model, module, engine,
                      fused_kernels_key(ctx.cfg, "actor_rollout_ref.actor.use_fused_kernels")),
                  rollout_correction=ctx.cfg.algorithm.rollout_correction)
    return Policy(actor, module, rollout_copy, rollout_model, extras.lm_prefix, lora)

"""The critic (value model), for estimators that use one (``algorithm.adv_estimator=gae``)."""

from __future__ import annotations

from typing import Any

from rlforge.config import uses_critic
from rlforge.config.lora import lora_enabled, lora_strategy
from rlforge.engine.varlen import maybe_select_varlen
from rlforge.models import load_value_model
from rlforge.models.lora import apply_lora
from rlforge.roles.critic import Critic
from rlforge.trainer import spmd
from rlforge.trainer.backoff import may_switch_checkpointing
from rlforge.trainer.builders.context import BuildContext
from rlforge.trainer.builders.engines import engine_name, make_engine, packs


def critic_model_path(cfg: Any) -> str:
    """``critic.model.path``, or the actor's model path when unset (as verl's default)."""
    return cfg.critic.model.path or cfg.actor_rollout_ref.model.path


def build_critic(ctx: BuildContext) -> Critic | None:
    """The value model (seeded) on its engine, with its LoRA adapter (``critic.model.lora_rank``;
    the value head is then trained whole beside it); None where the estimator needs no critic."""
    cfg = ctx.cfg
    if not uses_critic(cfg):
        return None
    c = cfg.critic
    module = load_value_model(critic_model_path(cfg), ctx.tokenizer, dict(c.model.override_config or {}),
                              seed=ctx.seed)
    maybe_select_varlen(module, ctx.device, bool(c.model.use_remove_padding) and packs(c.strategy),
                        c.model.override_config)
    lora = lora_enabled(c.model)
    if lora:
        apply_lora(module, c.model, "critic.model", critic_model_path(cfg), trainable=("score",), seed=ctx.seed)
    engine = make_engine(
        engine_name(lora_strategy(c.strategy, c.model)), module, ctx.device, fsdp_config=c.model.fsdp_config,
        optim_cfg=c.optim, total_steps=ctx.total_steps, optim_key="critic.optim", grad_clip=c.grad_clip,
        model_cfg=c.model, megatron_config=c.megatron, role_key="critic", trainable_state_only=lora,
        switchable_checkpointing=may_switch_checkpointing(  # online back-off may turn it on
            cfg, "critic.model.enable_gradient_checkpointing", spmd.world()[1]),
    )
    s, b = ctx.sizes, ctx.budgets
    return Critic(engine, c, s["critic_mini"], s["critic_micro"], s["critic_forward_micro"], b["critic"],
                  b["critic_forward"], bool(c.model.use_remove_padding) and engine.packed_forward)

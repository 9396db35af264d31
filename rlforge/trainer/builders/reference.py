"""The reference policy (forward-only log-probs for a KL term or a policy loss that asks for them):
a frozen copy of the policy's LM (:func:`build_reference`) or, with LoRA, the actor with its
adapter off (:func:`adapter_off_reference`)."""

from __future__ import annotations

import copy

from rlforge.config.lora import lora_enabled
from rlforge.config.validate import uses_ref
from rlforge.engine.adapter_off import AdapterOffEngine
from rlforge.roles.actor import Actor, LogProbModel
from rlforge.trainer.builders.context import BuildContext
from rlforge.trainer.builders.engines import engine_name, fused_kernels_key, head_chunk_size, make_engine
from rlforge.trainer.builders.policy import PolicyLM


def build_reference(ctx: BuildContext, lm: PolicyLM) -> LogProbModel | None:
    """A frozen copy of ``lm`` on its own engine (the actor's strategy, the ``ref`` blocks), where
    the job needs the reference (:func:`~rlforge.config.validate.uses_ref`) and LoRA is off; else
    None.  Call it before the actor's engine shards ``lm``."""
    cfg = ctx.cfg
    arr = cfg.actor_rollout_ref
    if not uses_ref(cfg) or lora_enabled(arr.model):
        return None
    module = copy.deepcopy(lm.module).requires_grad_(False)
    engine = make_engine(engine_name(arr.actor.strategy), module, ctx.device, fsdp_config=arr.ref.fsdp_config,
                         optim_cfg=None, total_steps=ctx.total_steps, optim_key="", megatron_config=arr.ref.megatron,
                         role_key="actor_rollout_ref.ref", compile_layers=bool(arr.ref.use_torch_compile),
                         share_prompts=lm.share_prompts)
    return LogProbModel(engine, ctx.sizes["ref_micro"], ctx.budgets["ref"],
                        bool(arr.model.use_remove_padding) and engine.packed_forward,
                        head_chunk_size(arr.model.use_fused_kernels, arr.model, module, engine,
                                        fused_kernels_key(cfg, "actor_rollout_ref.model.use_fused_kernels")))


def adapter_off_reference(ctx: BuildContext, actor: Actor) -> LogProbModel | None:
    """With LoRA, where the job needs the reference: the actor's engine with the adapter off (the
    base model, no second copy of the weights); else None."""
    cfg = ctx.cfg
    if not uses_ref(cfg) or not lora_enabled(cfg.actor_rollout_ref.model):
        return None
    engine = actor.engine
    return LogProbModel(AdapterOffEngine(engine), ctx.sizes["ref_micro"], ctx.budgets["ref"],
                        bool(cfg.actor_rollout_ref.model.use_remove_padding) and engine.packed_forward,
                        actor.head_chunk_size)

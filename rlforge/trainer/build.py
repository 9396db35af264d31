"""Build the parts of one RL job from its config: tokenizer, data, roles, rollout, rewards.

Each part has its own builder in :mod:`rlforge.trainer.builders`; everything that depends on
which backend, strategy or policy loss is chosen is picked from a registry there, so the step
loop in :mod:`rlforge.trainer.ppo_trainer` only talks to interfaces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlforge.data import PromptLoader
from rlforge.models.lora import LoraPlan
from rlforge.rewards import RewardManager
from rlforge.roles.actor import Actor, LogProbModel
from rlforge.roles.critic import Critic
from rlforge.rollout import Rollout
from rlforge.trainer.builders.context import build_context
from rlforge.trainer.builders.critic import build_critic
from rlforge.trainer.builders.policy import build_policy, load_policy_lm
from rlforge.trainer.builders.reference import adapter_off_reference, build_reference
from rlforge.trainer.builders.reward import build_reward
from rlforge.trainer.builders.rollout import build_rollout

__all__ = ["Job", "build_job"]


@dataclass(frozen=True, kw_only=True)
class Job:
    """The built parts of one job.

    Attributes:
        tokenizer: the policy's tokenizer.
        device: this process's device.
        actor: the trained policy.
        rollout_model: the rollout's own copy of the policy's causal LM (compute dtype; this
            rank's slices of the sharded linears under a tensor-parallel rollout), refreshed by
            ``sync_rollout``; its config and ``save_pretrained`` serve the trainer.
        rollout_shapes: ``{name: full shape}`` of ``rollout_model``'s state dict (what a
            checkpoint must match, whatever the rollout keeps on this rank).
        reference: the reference policy's log-probs, or None where no KL term or loss needs it.
        critic: the value model, or None.
        rollout: the generation backend.
        reward: the reward manager.
        train_loader, val_loader: the prompt loaders (``val_loader`` None without ``data.val_files``).
        total_steps: RL steps of the job.
        sync_rollout: ``() -> None``: make the actor's new weights visible to the rollout.
        actor_lora: the actor's LoRA adapter (``model.lora_rank > 0``), else None.
    """

    tokenizer: Any
    device: torch.device
    actor: Actor
    rollout_model: torch.nn.Module
    rollout_shapes: dict[str, tuple[int, ...]]
    reference: LogProbModel | None
    critic: Critic | None
    rollout: Rollout
    reward: RewardManager
    train_loader: PromptLoader
    val_loader: PromptLoader | None
    total_steps: int
    sync_rollout: Callable[[], None]
    actor_lora: LoraPlan | None = None


def build_job(cfg: Any) -> Job:
    """Load models and data and wire them together (in this order: data, reference, actor, critic,
    rollout, reward; the reference copy is taken before the actor's engine shards the policy).

    Raises:
        RLForgeError subclasses for bad paths, files or rows.
    """
    ctx, data = build_context(cfg)
    lm = load_policy_lm(ctx)
    reference = build_reference(ctx, lm)
    policy = build_policy(ctx, lm)
    if reference is None:
        reference = adapter_off_reference(ctx, policy.actor)
    critic = build_critic(ctx)
    rollout = build_rollout(ctx, policy)
    return Job(
        tokenizer=ctx.tokenizer, device=ctx.device, actor=policy.actor, rollout_model=policy.rollout_model,
        rollout_shapes=rollout.shapes, reference=reference, critic=critic, rollout=rollout.rollout, reward=build_reward(ctx),
        train_loader=data.train, val_loader=data.val, total_steps=ctx.total_steps, sync_rollout=rollout.sync,
        actor_lora=policy.lora,
    )

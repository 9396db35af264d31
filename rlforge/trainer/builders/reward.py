"""The reward: the rule/custom-function manager, wrapped by a reward model or judge where enabled."""

from __future__ import annotations

from rlforge.rewards import RewardManager, build_reward_manager
from rlforge.rewards.model_reward import with_model_reward
from rlforge.trainer.builders.context import BuildContext
from rlforge.trainer.builders.engines import autocast_dtype


def build_reward(ctx: BuildContext) -> RewardManager:
    """``reward_model`` / ``custom_reward_function`` / the data source's rule, as one manager
    (``reward_model.enable`` or ``reward_model.judge.enable`` wrap it with a model)."""
    manager = build_reward_manager(ctx.cfg, ctx.tokenizer)
    return with_model_reward(manager, ctx.cfg, ctx.device, ctx.seed, autocast_dtype(ctx.device))

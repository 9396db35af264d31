"""The root of the config tree, mirroring verl's ``ppo_trainer.yaml``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rlforge.config.actor import ActorRolloutRefConfig
from rlforge.config.algorithm import AlgorithmConfig
from rlforge.config.async_training import AsyncTrainingConfig
from rlforge.config.critic import CriticConfig
from rlforge.config.data import DataConfig
from rlforge.config.profiler import GlobalProfilerConfig
from rlforge.config.reward import CustomRewardFunctionConfig, RewardModelConfig
from rlforge.config.trainer import TrainerConfig


@dataclass
class RayKwargsConfig:
    """verl's ``ray_kwargs`` (rlforge runs without Ray: a value warns)."""

    ray_init: dict[str, Any] = field(default_factory=dict)
    """Free-form keyword arguments of ``ray.init`` (as in verl)."""
    timeline_json_file: str | None = None
    """Where verl writes Ray's timeline; None = none."""


@dataclass
class RLForgeConfig:
    """Everything one ``rlforge train`` run reads.  Build it with :func:`rlforge.config.load_config`."""

    data: DataConfig = field(default_factory=DataConfig)
    """Datasets, lengths and batch sizes."""
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    """Policy model, its training, reference and rollout."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (GAE only)."""
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    """Model-based reward and reward manager."""
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    """User reward function."""
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator and KL control."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Run loop, logging, checkpoints."""
    async_training: AsyncTrainingConfig = field(default_factory=AsyncTrainingConfig)
    """Partial rollout: over-provisioned prompts, early stop, carried-over responses (verl's section)."""
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)
    """verl's profiler block (:mod:`rlforge.config.profiler`): ``tool=torch`` with ``steps`` records those steps with torch.profiler
    (into ``save_path`` where set); every other setting warns (:mod:`rlforge.perf.verl_profiler`)."""
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    """verl's Ray settings (accepted and warned; rlforge does not use Ray)."""
    ray_init: dict[str, Any] = field(default_factory=dict)
    """Older verl name of ``ray_kwargs.ray_init`` (accepted; not used)."""


def uses_critic(cfg: RLForgeConfig) -> bool:
    """Whether the run trains a critic: ``critic.enable`` if set, else ``adv_estimator == 'gae'``."""
    if cfg.critic.enable is not None:
        return cfg.critic.enable
    return cfg.algorithm.adv_estimator == "gae"

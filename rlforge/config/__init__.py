"""Typed configuration with verl's key names and defaults.

Entry points: :func:`load_config` (layers: schema defaults <- job <- ``--config`` <- CLI
overrides), :func:`validate_config` (cross-field checks and warnings), :func:`format_config`
(resolved YAML).  The package and its validation import no torch (nor transformers, tensordict,
peft, numpy), so a config error comes back before their start-up; a check that needs torch imports
it inside the function, and only for a run that sets the key (``tests/cli/test_config_before_torch.py``).
Where each block lives::

    cfg.data                          DataConfig (data.py); cfg.data.builtin: BuiltinTaskConfig
    cfg.actor_rollout_ref             ActorRolloutRefConfig (actor.py)
        .model                        ModelConfig; .fused_kernel_options FusedKernelOptions
        .actor                        ActorConfig; .policy_loss PolicyLossConfig; .optim OptimConfig;
                                      .checkpoint CheckpointConfig; .fsdp_config FSDPConfig; .megatron MegatronConfig
        .ref                          RefConfig
        .rollout                      RolloutConfig (rollout.py); .val_kwargs SamplingConfig
    cfg.critic                        CriticConfig (critic.py); .model CriticModelConfig
    cfg.reward_model                  RewardModelConfig (reward.py); .model, .overlong_buffer
    cfg.custom_reward_function        CustomRewardFunctionConfig (reward.py)
    cfg.algorithm                     AlgorithmConfig (algorithm.py); .kl_ctrl, .pf_ppo, .filter_groups
    cfg.trainer                       TrainerConfig (trainer.py)
"""

from rlforge.config.actor import (
    DEFAULT_MODEL,
    ActorConfig,
    ActorRolloutRefConfig,
    FusedKernelOptions,
    ModelConfig,
    PolicyLossConfig,
    RefConfig,
)
from rlforge.config.algorithm import AlgorithmConfig, FilterGroupsConfig, KLControlConfig, PFPPOConfig
from rlforge.config.common import CheckpointConfig, FSDPConfig, MegatronConfig, OptimConfig, WrapPolicyConfig
from rlforge.config.critic import CriticConfig, CriticModelConfig
from rlforge.config.data import BuiltinTaskConfig, CustomClsConfig, DataConfig
from rlforge.config.format import format_config
from rlforge.config.later_work import LATER_WORK, SUPPORTED_LOGGERS, effective_loggers
from rlforge.config.loader import ConfigWarning, available_jobs, load_config
from rlforge.config.reward import (
    CustomRewardFunctionConfig,
    OverlongBufferConfig,
    RewardModelConfig,
    RewardModelModelConfig,
)
from rlforge.config.rollout import RolloutConfig, SamplingConfig
from rlforge.config.root import RLForgeConfig, uses_critic
from rlforge.config.trainer import TrainerConfig
from rlforge.config.validate import validate_config

__all__ = [
    "DEFAULT_MODEL",
    "LATER_WORK",
    "SUPPORTED_LOGGERS",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "BuiltinTaskConfig",
    "CheckpointConfig",
    "ConfigWarning",
    "CriticConfig",
    "CriticModelConfig",
    "CustomClsConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "FSDPConfig",
    "FilterGroupsConfig",
    "FusedKernelOptions",
    "KLControlConfig",
    "MegatronConfig",
    "ModelConfig",
    "OptimConfig",
    "OverlongBufferConfig",
    "PFPPOConfig",
    "PolicyLossConfig",
    "RLForgeConfig",
    "RefConfig",
    "RewardModelConfig",
    "RewardModelModelConfig",
    "RolloutConfig",
    "SamplingConfig",
    "TrainerConfig",
    "WrapPolicyConfig",
    "available_jobs",
    "effective_loggers",
    "format_config",
    "load_config",
    "uses_critic",
    "validate_config",
]

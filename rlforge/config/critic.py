"""``critic.*``: the value model used by GAE (verl key names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from rlforge.config.common import CheckpointConfig, FSDPConfig, MegatronConfig, OptimConfig
from rlforge.config.profiler import RoleProfilerConfig


def _critic_optim() -> OptimConfig:
    return OptimConfig(lr=1e-5)


@dataclass
class CriticModelConfig:
    """Value model (``critic.model``)."""

    path: str | None = None
    """Model to initialise the critic from (backbone + new value head); None = the actor's ``model.path``."""
    tokenizer_path: str = II("actor_rollout_ref.model.path")
    """Tokenizer location; defaults to the actor's model path."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Free-form overrides of the HF model config."""
    external_lib: str | None = II("actor_rollout_ref.model.external_lib")
    """Module imported before loading; defaults to the actor's."""
    trust_remote_code: bool = II("actor_rollout_ref.model.trust_remote_code")
    """Defaults to the actor's."""
    use_shm: bool = False
    """Copy weights to shared memory before loading (accepted; no effect)."""
    enable_gradient_checkpointing: bool = True
    """Recompute activations in backward."""
    enable_activation_offload: bool = False
    """Offload activations to CPU."""
    use_remove_padding: bool = False
    """Pack sequences without padding in forward."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP settings."""
    lora_rank: int = 0
    """LoRA rank of the value model; 0 = full fine-tuning; >= 0.  The value head (``score``) is
    trained whole beside the adapter."""
    lora_alpha: int = 16
    """LoRA scaling numerator (scale = alpha / rank); > 0; only with ``lora_rank`` > 0."""
    target_modules: Any = "all-linear"
    """LoRA target modules, as ``actor_rollout_ref.model.target_modules``."""
    exclude_modules: Any = None
    """Modules excluded from LoRA; None = none."""
    lora_adapter_path: str | None = None
    """A peft adapter folder to start the critic from; None = a new adapter."""


@dataclass
class CriticConfig:
    """Critic training (only used when ``algorithm.adv_estimator=gae``)."""

    rollout_n: int = II("actor_rollout_ref.rollout.n")
    """Responses per prompt; defaults to ``rollout.n``."""
    strategy: str = "fsdp"
    """Training engine: ``fsdp`` | ``fsdp2`` | ``megatron``."""
    enable: bool | None = None
    """Force the critic on/off; None = on exactly when the advantage estimator needs values (gae)."""
    optim: OptimConfig = field(default_factory=_critic_optim)
    """Optimizer and schedule (verl default lr 1e-5)."""
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    """Value model."""
    ppo_mini_batch_size: int = II("actor_rollout_ref.actor.ppo_mini_batch_size")
    """Prompts per optimizer step; defaults to the actor's."""
    ppo_micro_batch_size: int | None = None
    """Deprecated global micro batch; None = unset."""
    ppo_micro_batch_size_per_gpu: int | None = None
    """Sequences per forward/backward; None = whole mini batch."""
    forward_micro_batch_size: int | None = None
    """Deprecated global forward micro batch; None = unset."""
    forward_micro_batch_size_per_gpu: int | None = II(".ppo_micro_batch_size_per_gpu")
    """Sequences per value forward pass; defaults to ``ppo_micro_batch_size_per_gpu``."""
    use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Pack by tokens; defaults to the actor's."""
    ppo_max_token_len_per_gpu: int = 32768
    """Token budget per packed training micro batch (tokens)."""
    forward_max_token_len_per_gpu: int = II(".ppo_max_token_len_per_gpu")
    """Token budget per packed forward micro batch; defaults to ``ppo_max_token_len_per_gpu``."""
    ppo_epochs: int = II("actor_rollout_ref.actor.ppo_epochs")
    """Passes per rollout batch; defaults to the actor's."""
    shuffle: bool = II("actor_rollout_ref.actor.shuffle")
    """Defaults to the actor's."""
    grad_clip: float = 1.0
    """Gradient-norm clip (L2)."""
    cliprange_value: float = 0.5
    """Value clip range (absolute, in reward units)."""
    loss_agg_mode: str = II("actor_rollout_ref.actor.loss_agg_mode")
    """Value-loss aggregation; defaults to the actor's."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence-parallel degree; 1 = off."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint contents."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """Megatron settings (``strategy=megatron``)."""
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    """verl's per-role profiler (:mod:`rlforge.config.profiler`); rlforge profiles whole steps."""

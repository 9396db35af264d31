"""Config blocks shared by several roles: optimizer, checkpoint, FSDP and Megatron settings.

Key names and defaults follow verl's ``ppo_trainer.yaml`` (``optim``, ``checkpoint``,
``fsdp_config``, ``megatron``).  Only the actor, ref and critic embed these blocks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II


@dataclass
class OptimConfig:
    """AdamW optimizer and learning-rate schedule of one trained model (actor or critic)."""

    lr: float = 1e-6
    """Peak learning rate (per step, unitless).  verl: actor 1e-6, critic 1e-5."""
    lr_warmup_steps: int = -1
    """Linear warmup length in optimizer steps; -1 = use ``lr_warmup_steps_ratio`` instead."""
    lr_warmup_steps_ratio: float = 0.0
    """Warmup length as a fraction of ``total_training_steps``; used when ``lr_warmup_steps`` is -1."""
    min_lr_ratio: float = 0.0
    """Floor of the cosine schedule as a fraction of ``lr`` (0.0 = decay to zero)."""
    num_cycles: float = 0.5
    """Number of cosine half-waves over training (0.5 = one decay from peak to floor)."""
    lr_scheduler_type: str = "constant"
    """Schedule after warmup: ``constant`` | ``cosine``.  verl's older key ``warmup_style`` is accepted as an alias."""
    weight_decay: float = 0.01
    """Decoupled (AdamW) weight decay coefficient."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """AdamW (beta1, beta2)."""
    total_training_steps: int = -1
    """Schedule length in optimizer steps; -1 = filled in by the trainer from data size and epochs."""
    optimizer: str = "AdamW"
    """Optimizer class name inside ``optimizer_impl``."""
    optimizer_impl: str = "torch.optim"
    """Module holding ``optimizer``."""
    override_optimizer_config: dict[str, Any] | None = None
    """Extra keyword arguments for the optimizer constructor; None = none."""


@dataclass
class CheckpointConfig:
    """What a checkpoint of one role contains."""

    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    """Parts written at each save (``trainer.save_freq``): ``model``, ``optimizer`` and ``extra`` (scheduler, RNG)
    make a resumable checkpoint and go together in this build; ``hf_model`` adds the policy as a Hugging Face
    folder (``global_step_N/actor/huggingface``: safetensors, config, tokenizer).  ``[hf_model]`` alone (the
    actor's) writes only that folder and ``config.yaml``: the trained model, not a checkpoint to resume from."""
    load_contents: list[str] = II(".save_contents")
    """Parts read on resume; defaults to ``save_contents``."""
    async_save: bool = False
    """Write this role's sharded checkpoint in a background thread: the save returns once the shards are copied
    to host memory (pinned on CUDA) and overlaps the next steps; the tracker file names the checkpoint only when
    it is complete.  A save still running when the next is due is waited for.  Full-format roles (strategy
    megatron, LoRA adapters) save synchronously (docs/checkpoints.md)."""


def hf_model_only(save_contents: Any) -> bool:
    """True when ``checkpoint.save_contents`` asks for the Hugging Face folder and none of the
    resumable parts (``model``, ``optimizer``, ``extra``): a save then writes only that folder."""
    parts = set(save_contents or ())
    return "hf_model" in parts and not parts & {"model", "optimizer", "extra"}


def get_key(cfg: Any, dotted: str) -> Any:
    """Value at a dotted key of a config made of dataclasses and dicts."""
    node = cfg
    for part in dotted.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


@dataclass
class WrapPolicyConfig:
    """FSDP auto-wrap policy."""

    min_num_params: int = 0
    """Wrap a module in its own FSDP unit once it has this many parameters; 0 = wrap per transformer layer."""


@dataclass
class FSDPConfig:
    """FSDP sharding and offload settings of one role (verl ``fsdp_config``)."""

    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)
    """Auto-wrap policy."""
    param_offload: bool = False
    """Keep the parameters on the CPU between phases (weight sync, log-prob passes, the update) and on the
    GPU inside each one, as verl's FSDP workers do (FSDP1 and FSDP2; :mod:`rlforge.engine.param_offload`).
    On a CPU run: one warning, nothing to offload to."""
    optimizer_offload: bool = False
    """Keep optimizer state on CPU between updates."""
    offload_policy: bool = False
    """FSDP2 CPUOffloadPolicy (parameters, gradients and optimizer on CPU)."""
    reshard_after_forward: bool = True
    """Free gathered parameters after forward (ZeRO-3 behaviour); False keeps them (ZeRO-2)."""
    fsdp_size: int = -1
    """Ranks per FSDP shard group; -1 = all ranks (no hybrid sharding)."""
    forward_prefetch: bool = False
    """Prefetch the next unit's all-gather during forward."""
    model_dtype: str = "fp32"
    """Dtype of the trained master parameters: ``fp32`` | ``bf16`` | ``fp16``."""
    mixed_precision: dict[str, Any] | None = None
    """Mixed-precision dtypes (``param_dtype``, ``reduce_dtype``, ``buffer_dtype``); None = bf16 compute, fp32 reduce."""


@dataclass
class MegatronConfig:
    """Megatron-Core parallel settings of one role (verl ``megatron``); used when ``strategy=megatron``."""

    param_offload: bool = False
    """Keep parameters on CPU between uses."""
    grad_offload: bool = False
    """Keep gradients on CPU between uses."""
    optimizer_offload: bool = False
    """Keep optimizer state on CPU between updates."""
    tensor_model_parallel_size: int = 1
    """Tensor-parallel degree (ranks per layer shard)."""
    expert_model_parallel_size: int = 1
    """Expert-parallel degree for MoE layers."""
    expert_tensor_parallel_size: int | None = None
    """Tensor-parallel degree inside experts; None = same as ``tensor_model_parallel_size``."""
    pipeline_model_parallel_size: int = 1
    """Pipeline-parallel degree (stages)."""
    virtual_pipeline_model_parallel_size: int | None = None
    """Interleaved virtual stages per pipeline rank; None = no interleaving."""
    context_parallel_size: int = 1
    """Context-parallel degree (sequence split across ranks)."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism for norms/dropout (only matters with TP > 1)."""
    use_distributed_optimizer: bool = True
    """Shard optimizer state across data-parallel ranks."""
    use_dist_checkpointing: bool = False
    """Load weights from a Megatron distributed checkpoint."""
    dist_checkpointing_path: str | None = None
    """Path of that checkpoint; None = none."""
    seed: int = 42
    """Seed of Megatron's model-parallel RNG."""
    override_transformer_config: dict[str, Any] = field(default_factory=dict)
    """Free-form overrides of Megatron's TransformerConfig (recompute, attention backend, ...)."""
    override_ddp_config: dict[str, Any] = field(default_factory=dict)
    """Free-form overrides of Megatron's DistributedDataParallelConfig."""
    use_mbridge: bool = False
    """Convert HF weights with mbridge."""
    dtype: str = "bfloat16"
    """Parameter dtype: ``bfloat16`` | ``float16``."""

"""The devices, engines and engine options of a job's roles (shared by the role builders)."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from rlforge.config.user_keys import user_set
from rlforge.engine import ENGINES, TrainEngine
from rlforge.engine.activation import apply_activation_wrappers
from rlforge.engine.varlen import ATTN_IMPLEMENTATION, attn_implementation
from rlforge.errors import ConfigError, RLForgeWarning
from rlforge.roles.fused_head import fused_head_unsupported, set_impl_backend


def pick_device(name: str) -> torch.device:
    """``trainer.device``: ``auto`` = CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"trainer.device={name} but no CUDA GPU is visible; use trainer.device=cpu or auto")
    return torch.device(name)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bfloat16 autocast on CUDA (float32 master weights), none on CPU."""
    return torch.bfloat16 if device.type == "cuda" else None


def rollout_weights_dtype(device: torch.device) -> torch.dtype:
    """dtype of the rollout's own copy of the policy: the compute dtype (bfloat16 on CUDA, where the
    rollout would cast the float32 master weights to it anyway; float32 on CPU)."""
    return autocast_dtype(device) or torch.float32


def engine_name(strategy: str) -> str:
    """The registered engine of ``actor.strategy`` / ``critic.strategy`` (``fsdp`` = FSDP1, ``fsdp2``,
    ``megatron``), whatever the number of processes: one process runs the same sharded engine on
    a one-device mesh (:func:`~rlforge.engine.distributed.init_single_process`), so offload, mixed
    precision, reshard and prefetch keys mean the same on 1 device and on N."""
    return strategy


def packs(strategy: str) -> bool:
    """Whether the engine for ``strategy`` runs the roles' packed forward (``TrainEngine.packed_forward``)."""
    return bool(getattr(ENGINES.get(engine_name(strategy)), "packed_forward", True))


def make_engine(name: str, module: torch.nn.Module, device: torch.device, *, fsdp_config: Any,
                optim_cfg: Any | None, total_steps: int, optim_key: str, grad_clip: float = 1.0,
                param_groups: Any = None, model_cfg: Any = None, megatron_config: Any = None, role_key: str = "",
                compile_layers: bool = False, share_prompts: bool = False,
                trainable_state_only: bool = False, switchable_checkpointing: bool = False) -> TrainEngine:
    """Build the engine registered as ``name`` (``fsdp2``, ``fsdp``, ``megatron``) around ``module``;
    ``role_key`` (e.g. ``critic``) is the role's config prefix, named in errors; ``share_prompts``
    and ``trainable_state_only``: the engine options of those names (:class:`TrainEngine`).
    ``switchable_checkpointing``: with checkpointing and activation offload off and an FSDP engine,
    the decoder layers get their wrappers anyway (both off), so that online back-off can turn
    checkpointing on (:func:`~rlforge.engine.activation.switch_checkpointing`)."""
    ckpt = bool(model_cfg is not None and model_cfg.enable_gradient_checkpointing)
    act_offload = bool(model_cfg is not None and model_cfg.enable_activation_offload)
    if switchable_checkpointing and not (ckpt or act_offload) and name in ("fsdp", "fsdp2"):
        apply_activation_wrappers(module, False, False, switchable=True)  # the engine's own call is then a no-op
    return ENGINES.get(name)(
        module, device, fsdp_config=fsdp_config, optim_cfg=optim_cfg, total_steps=total_steps, optim_key=optim_key,
        grad_clip=grad_clip, param_groups=param_groups, megatron_config=megatron_config, role_key=role_key,
        gradient_checkpointing=ckpt, activation_offload=act_offload,
        compile_layers=compile_layers, share_prompts=share_prompts, trainable_state_only=trainable_state_only,
    )


_MODEL_FUSED = "actor_rollout_ref.model.use_fused_kernels"


def fused_kernels_key(cfg: Any, own_key: str) -> str | None:
    """The ``use_fused_kernels`` key that the user set for a role
    (:func:`~rlforge.config.user_keys.user_set`): ``own_key`` (e.g.
    ``actor_rollout_ref.actor.use_fused_kernels``), else ``actor_rollout_ref.model.use_fused_kernels``,
    which it follows by default; None when the user set neither (true is then rlforge's default,
    and falling back to the full logits needs no warning)."""
    for key in dict.fromkeys((own_key, _MODEL_FUSED)):
        if user_set(cfg, key):
            return key
    return None


def head_chunk_size(use_fused_kernels: bool, model_cfg: Any, module: torch.nn.Module, engine: TrainEngine,
                    key: str | None) -> int:
    """Positions per chunk of the chunked LM-head log-probs (``model.fused_kernel_options.chunk_size``)
    when ``use_fused_kernels`` (config key ``key``), the engine can read the head's weight after
    forward and the model's logits are exactly ``lm_head(hidden)``; else 0 (the model's full
    logits), with a warning naming ``key`` when the engine or the model is the reason (none when
    ``key`` is None: the user set no such key, :func:`fused_kernels_key`)."""
    if not use_fused_kernels:
        return 0
    reason = fused_head_unsupported(module)
    if reason is None and not engine.head_readable_after_forward:
        reason = (f"the {type(engine).__name__} re-shards or splits the LM head after forward "
                  "(use actor_rollout_ref.actor.strategy=fsdp2 for the chunked head)")
    if reason is not None and key is None:
        return 0
    if reason is not None:
        warnings.warn(f"{key}=true but {reason}; using the model's full logits", category=RLForgeWarning, stacklevel=2)
        return 0
    set_impl_backend(model_cfg.fused_kernel_options.impl_backend)
    return int(model_cfg.fused_kernel_options.chunk_size)


def prefix_grouper(module: torch.nn.Module, packed: bool, choice: bool | None, n: int) -> bool:
    """Whether ``actor.use_prefix_grouper`` takes effect.  ``choice`` True: on the padding-free
    forward (``packed``; otherwise ``config.later_work`` has warned) with ``rlforge_varlen``
    attention (a warning where the model has another, e.g. on CPU, where it is chosen only by
    ``model.override_config.attn_implementation=rlforge_varlen``).  None (the default): the same,
    without warnings, and only where a prompt has several responses (``rollout.n`` = ``n`` > 1).
    False: never."""
    if choice is False or not packed or (choice is None and n <= 1):
        return False
    impl = attn_implementation(module)
    if impl != ATTN_IMPLEMENTATION:
        if choice is None:
            return False
        warnings.warn(f"actor_rollout_ref.actor.use_prefix_grouper=True needs the {ATTN_IMPLEMENTATION!r} attention, "
                      f"the model has {impl!r} (it is chosen on CUDA, or by actor_rollout_ref.model.override_config."
                      f"attn_implementation={ATTN_IMPLEMENTATION}); ignored", category=RLForgeWarning, stacklevel=2)
        return False
    return True

"""The tuner's choices (:class:`Levers`) and the config keys each one writes (:data:`KEYS`).

Every key here is in :data:`rlforge.config.auto_keys.LEVER_KEYS`: dynamic batching and token budgets,
the padding-free forward, fused kernels and liger, checkpointing and activation offload, parameter and
optimizer offload, FSDP resharding and prefetch, and the rollout's memory keys.  None of them changes
what is learned (tests/tune/test_levers_only.py walks the schema).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

_ARR = "actor_rollout_ref"
_FSDP = (f"{_ARR}.actor.fsdp_config", f"{_ARR}.ref.fsdp_config", "critic.model.fsdp_config")


@dataclass(frozen=True)
class Levers:
    """One setting of the levers (units: tokens per GPU for the budgets, a fraction for memory)."""

    dynamic_bsz: bool = False
    token_budget: int = 16384
    log_prob_budget: int = 16384
    remove_padding: bool = False
    fused_kernels: bool = True
    liger: bool = False
    checkpointing: bool = True
    activation_offload: bool = False
    param_offload: bool = False
    optimizer_offload: bool = False
    ref_param_offload: bool = False
    reshard: bool = True
    forward_prefetch: bool = False
    gpu_memory_utilization: float = 0.5
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    free_cache_engine: bool = True


KEYS: dict[str, tuple[str, ...]] = {
    "dynamic_bsz": (f"{_ARR}.actor.use_dynamic_bsz", f"{_ARR}.ref.log_prob_use_dynamic_bsz",
                    f"{_ARR}.rollout.log_prob_use_dynamic_bsz", "critic.use_dynamic_bsz"),
    "token_budget": (f"{_ARR}.actor.ppo_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu"),
    "log_prob_budget": (f"{_ARR}.rollout.log_prob_max_token_len_per_gpu", f"{_ARR}.ref.log_prob_max_token_len_per_gpu",
                        "critic.forward_max_token_len_per_gpu"),
    "remove_padding": (f"{_ARR}.model.use_remove_padding", f"{_ARR}.actor.use_remove_padding",
                       "critic.model.use_remove_padding"),
    "fused_kernels": (f"{_ARR}.model.use_fused_kernels", f"{_ARR}.actor.use_fused_kernels"),
    "liger": (f"{_ARR}.model.use_liger",),
    "checkpointing": (f"{_ARR}.model.enable_gradient_checkpointing", "critic.model.enable_gradient_checkpointing"),
    "activation_offload": (f"{_ARR}.model.enable_activation_offload", "critic.model.enable_activation_offload"),
    "param_offload": (f"{_ARR}.actor.fsdp_config.param_offload", "critic.model.fsdp_config.param_offload"),
    "optimizer_offload": (f"{_ARR}.actor.fsdp_config.optimizer_offload", "critic.model.fsdp_config.optimizer_offload"),
    "ref_param_offload": (f"{_ARR}.ref.fsdp_config.param_offload",),
    "reshard": tuple(f"{n}.reshard_after_forward" for n in _FSDP),
    "forward_prefetch": tuple(f"{n}.forward_prefetch" for n in _FSDP),
    "gpu_memory_utilization": (f"{_ARR}.rollout.gpu_memory_utilization",),
    "max_num_seqs": (f"{_ARR}.rollout.max_num_seqs",),
    "max_num_batched_tokens": (f"{_ARR}.rollout.max_num_batched_tokens",),
    "free_cache_engine": (f"{_ARR}.rollout.free_cache_engine",),
}
"""Lever -> the config keys it writes (the first one is the lever's key in tables and messages)."""

LEVER_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Levers))


def written_keys() -> set[str]:
    """Every config key the tuner may write."""
    return {k for keys in KEYS.values() for k in keys}

"""The keys that accept ``auto`` (issue 39): the levers that change how fast a step runs, never what it learns.

``key=auto`` (command line, ``--config`` file, a Hydra config, a verl script's overrides) hands the key
to the tuner (:mod:`rlforge.tune`); so does leaving a lever key unset.  A key the user set to a value is
never changed.  The loader (:func:`strip_auto`) removes an ``auto`` value from its layer, puts the key
back to its schema default and records it (:func:`auto_keys`); ``auto`` on any other key is one
:class:`~rlforge.errors.ConfigError` naming the key and the keys that accept ``auto``.

Torch-free: the config package imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rlforge.errors import ConfigError

AUTO = "auto"
_ARR = "actor_rollout_ref"
_FSDP_KEYS = ("param_offload", "optimizer_offload", "reshard_after_forward", "forward_prefetch")

LEVER_KEYS: tuple[str, ...] = (
    f"{_ARR}.actor.use_dynamic_bsz", f"{_ARR}.actor.ppo_max_token_len_per_gpu",
    f"{_ARR}.ref.log_prob_use_dynamic_bsz", f"{_ARR}.ref.log_prob_max_token_len_per_gpu",
    f"{_ARR}.rollout.log_prob_use_dynamic_bsz", f"{_ARR}.rollout.log_prob_max_token_len_per_gpu",
    f"{_ARR}.model.use_remove_padding", f"{_ARR}.model.use_fused_kernels", f"{_ARR}.model.use_liger",
    f"{_ARR}.model.enable_gradient_checkpointing", f"{_ARR}.model.enable_activation_offload",
    f"{_ARR}.actor.use_remove_padding", f"{_ARR}.actor.use_fused_kernels",
    *(f"{_ARR}.{role}.fsdp_config.{k}" for role in ("actor", "ref") for k in _FSDP_KEYS),
    f"{_ARR}.rollout.gpu_memory_utilization", f"{_ARR}.rollout.max_num_seqs",
    f"{_ARR}.rollout.max_num_batched_tokens", f"{_ARR}.rollout.free_cache_engine",
    "critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu",
    "critic.model.use_remove_padding", "critic.model.enable_gradient_checkpointing",
    "critic.model.enable_activation_offload", *(f"critic.model.fsdp_config.{k}" for k in _FSDP_KEYS),
)
"""Every key that accepts ``auto`` (verl's names), dotted from the config root."""

_ATTR = "_rlforge_auto_keys"


def auto_error(key: str) -> ConfigError:
    """The one error for ``auto`` on a key with no tuner."""
    return ConfigError(f"{key}=auto: '{key}' has no tuner; auto is accepted only by: {', '.join(LEVER_KEYS)}")


def _text_key(dotted: str) -> bool:
    """Whether ``dotted`` takes text (``trainer.device``, ``trainer.resume_mode``: ``auto`` is their own value)."""
    from rlforge.config import schema
    from rlforge.config.root import RLForgeConfig

    tp = schema.lookup(RLForgeConfig, dotted)
    return tp is None or schema.kind_of(tp) == "free" or schema.strip_optional(tp) in (str, Any)


def strip_auto(data: dict[str, Any], prefix: str = "") -> list[str]:
    """Remove every ``auto`` leaf of a lever key from the nested layer ``data`` in place; return their
    dotted keys.  A key that takes text keeps ``auto`` as its value.

    Raises:
        ConfigError: ``auto`` on a key that is neither a lever nor text (:func:`auto_error`).
    """
    found: list[str] = []
    for key in list(data):
        value, full = data[key], f"{prefix}{key}"
        if isinstance(value, dict):
            found += strip_auto(value, f"{full}.")
            if not value and found and any(k.startswith(f"{full}.") for k in found):
                del data[key]  # a block that held only auto values
        elif isinstance(value, str) and value.strip().lower() == AUTO:
            if full not in LEVER_KEYS:
                if _text_key(full):
                    continue
                raise auto_error(full)
            del data[key]
            found.append(full)
    return found


def record_auto_keys(cfg: Any, keys: Iterable[str]) -> None:
    """Record on ``cfg`` the keys the user gave as ``auto``."""
    object.__setattr__(cfg, _ATTR, frozenset(keys))


def auto_keys(cfg: Any) -> frozenset[str]:
    """The keys recorded by :func:`record_auto_keys` (empty for a config built in code)."""
    return getattr(cfg, _ATTR, frozenset())

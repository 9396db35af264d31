"""The config-only part of LoRA (``model.lora_rank``, ``lora_alpha``, ``target_modules``,
``exclude_modules``, ``lora_adapter_path``): which roles train an adapter and the checks that need
no model.  Importable without torch, so validation runs before torch loads; the adapter itself is
built in :mod:`rlforge.models.lora`.
"""

from __future__ import annotations

from typing import Any

from rlforge.errors import ConfigError

DEFAULT_ALPHA = 16
"""The schema default of ``lora_alpha`` (a non-default value without a rank is an error)."""


def lora_enabled(model_cfg: Any) -> bool:
    """Whether the role trains a LoRA adapter: ``lora_rank > 0`` or ``lora_adapter_path`` set."""
    return int(getattr(model_cfg, "lora_rank", 0) or 0) > 0 or bool(getattr(model_cfg, "lora_adapter_path", None))


def lora_strategy(strategy: str, model_cfg: Any) -> str:
    """The engine a role's ``strategy`` runs with LoRA on: FSDP1 (``fsdp``) cannot train a flat
    parameter that mixes the frozen base with the adapter after a no-grad forward (torch's
    ``use_orig_params`` assertion, measured on torch 2.13 CPU), and the tensor/pipeline-parallel
    engine (``megatron``) has no LoRA yet, so LoRA runs on ``fsdp2`` for both (validation warns);
    other strategies unchanged."""
    return "fsdp2" if strategy in ("fsdp", "megatron") and lora_enabled(model_cfg) else strategy


def check_lora_keys(model_cfg: Any, node: str) -> None:
    """Config-only checks of the LoRA keys of the model block ``node`` (e.g. ``critic.model``).

    Raises:
        ConfigError: ``lora_rank < 0``; ``lora_alpha <= 0`` with a rank; ``lora_alpha``,
            ``target_modules`` or ``exclude_modules`` changed while LoRA is off.
    """
    rank = int(model_cfg.lora_rank)
    if rank < 0:
        raise ConfigError(f"{node}.lora_rank={rank}: must be >= 0 (0 = full fine-tuning, e.g. 8, 16, 64 for LoRA)")
    if lora_enabled(model_cfg):
        if float(model_cfg.lora_alpha) <= 0:
            raise ConfigError(f"{node}.lora_alpha={model_cfg.lora_alpha}: must be > 0 (scale = alpha / rank)")
        return
    if int(model_cfg.lora_alpha) != DEFAULT_ALPHA:
        raise ConfigError(f"{node}.lora_alpha={model_cfg.lora_alpha} is set but {node}.lora_rank=0 (LoRA off); "
                          f"set {node}.lora_rank (e.g. 8) or drop lora_alpha")
    for name, default in (("target_modules", "all-linear"), ("exclude_modules", None)):
        value = getattr(model_cfg, name, default)
        if plain_list(value) != default:
            raise ConfigError(f"{node}.{name}={plain_list(value)} is set but {node}.lora_rank=0 (LoRA off); "
                              f"set {node}.lora_rank (e.g. 8) or drop {name}")


def plain_list(value: Any) -> Any:
    """An OmegaConf list as a plain list (other values unchanged)."""
    if value is None or isinstance(value, str | int | float):
        return value
    return [str(v) for v in value]


def adapter_path_overrides(model_cfg: Any, node: str) -> list[str]:
    """Warnings for the LoRA keys that ``lora_adapter_path`` overrides: the adapter folder's own
    ``adapter_config.json`` sets the rank, alpha and target modules (as peft loads it), so explicit
    ``lora_rank``/``lora_alpha``/``target_modules``/``exclude_modules`` are not used; and with
    ``lora_rank=0`` the adapter still turns LoRA on."""
    path = getattr(model_cfg, "lora_adapter_path", None)
    if not path:
        return []
    rank = int(model_cfg.lora_rank or 0)
    ignored = [f"{node}.lora_rank={rank}"] if rank > 0 else []
    if int(model_cfg.lora_alpha) != DEFAULT_ALPHA:
        ignored.append(f"{node}.lora_alpha={model_cfg.lora_alpha}")
    for name, default in (("target_modules", "all-linear"), ("exclude_modules", None)):
        value = plain_list(getattr(model_cfg, name, default))
        if value != default:
            ignored.append(f"{node}.{name}={value}")
    out = []
    if ignored:
        out.append(f"{node}.lora_adapter_path={path}: the adapter's own adapter_config.json sets its rank, alpha and "
                   f"target modules; {', '.join(ignored)} ignored")
    if rank == 0:
        out.append(f"{node}.lora_adapter_path={path} with {node}.lora_rank=0: LoRA is on, with the adapter's own "
                   "rank (the base model stays frozen)")
    return out

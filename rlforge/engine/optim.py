"""Optimizer and learning-rate schedule from ``*.optim`` config (verl's keys).

The schedules come from transformers: linear warmup over ``lr_warmup_steps`` (or, when
that is -1, ``lr_warmup_steps_ratio * total_training_steps``), then constant, or cosine
decay to ``min_lr_ratio * lr`` over ``num_cycles`` cycles.  The schedule is stepped once
per RL step, as in verl.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

from rlforge.errors import ConfigError


def _schedule_type(optim_cfg: Any) -> str:
    return str(getattr(optim_cfg, "lr_scheduler_type", None) or getattr(optim_cfg, "warmup_style", "constant"))


def warmup_steps(optim_cfg: Any, total_steps: int) -> int:
    """Number of warmup steps: ``lr_warmup_steps`` if positive, else ratio × total."""
    if optim_cfg.lr_warmup_steps is not None and optim_cfg.lr_warmup_steps > 0:
        return int(optim_cfg.lr_warmup_steps)
    return int(float(optim_cfg.lr_warmup_steps_ratio) * total_steps)


def build_optimizer(params: list[torch.nn.Parameter] | list[dict[str, Any]], optim_cfg: Any) -> torch.optim.Optimizer:
    """AdamW with ``lr``, ``betas`` and ``weight_decay`` from ``optim_cfg``.

    ``params`` may be parameter groups (dicts); a group's own ``lr`` overrides ``optim_cfg.lr``.
    Where every parameter is on a CUDA device the fused implementation runs (``fused=True``: one
    kernel for the whole update instead of torch's multi-tensor ``foreach`` launches); elsewhere
    (CPU, CPU-offloaded parameters) torch's default.
    """
    betas = tuple(float(b) for b in (getattr(optim_cfg, "betas", None) or (0.9, 0.999)))
    flat = [p for g in params for p in (g["params"] if isinstance(g, dict) else [g])]
    fused = bool(flat) and all(p.device.type == "cuda" for p in flat)
    return torch.optim.AdamW(
        params, lr=float(optim_cfg.lr), betas=betas, weight_decay=float(optim_cfg.weight_decay),  # type: ignore[arg-type]
        fused=fused or None,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, optim_cfg: Any, total_steps: int, key: str
) -> torch.optim.lr_scheduler.LRScheduler:
    """The LR schedule; ``key`` (e.g. ``actor_rollout_ref.actor.optim``) names the config in errors.

    Raises:
        ConfigError: for an unknown schedule type.
    """
    kind = _schedule_type(optim_cfg)
    warm = warmup_steps(optim_cfg, total_steps)
    if kind == "constant":
        return get_constant_schedule_with_warmup(optimizer, num_warmup_steps=warm)
    if kind == "cosine":
        return get_cosine_with_min_lr_schedule_with_warmup(
            optimizer,
            num_warmup_steps=warm,
            num_training_steps=max(total_steps, 1),
            num_cycles=float(optim_cfg.num_cycles),
            min_lr_rate=float(optim_cfg.min_lr_ratio or 0.0),
        )
    raise ConfigError(f"{key}.lr_scheduler_type={kind!r}: expected 'constant' or 'cosine'")

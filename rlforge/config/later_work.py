"""The one table of keys that are accepted (verl compatibility) but not effective in this build.

This build trains and generates in one process with the ``hf`` rollout.  A verl command line
may set vLLM, Megatron, FSDP-sharding or multi-node keys; they are accepted and reported here
with one warning line each, only when set to a value that would matter.  When a feature lands,
delete its row.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlforge.config.common import MegatronConfig
from rlforge.errors import ConfigError

SUPPORTED_LOGGERS = ("console", "file")
"""``trainer.logger`` entries this build runs."""

VERL_LOGGERS = ("wandb", "mlflow", "swanlab", "vemlp_wandb", "tensorboard", "clearml", "trackio")
"""verl's other loggers: accepted with a warning and skipped; any other name is an error."""


@dataclass(frozen=True)
class LaterWork:
    """One accepted-but-not-effective key.

    Attributes:
        key: dotted config key (or a label for a combination, with ``value_of`` set).
        matters: True when the value would change behaviour if the feature existed.
        message: warning text; ``{key}`` and ``{value}`` are filled in.
        value_of: computes the value from the config; None = read ``key``.
    """

    key: str
    matters: Callable[[Any], bool]
    message: str
    value_of: Callable[[Any], Any] | None = None


_NOT_HERE = "{key}={value} is not available in this single-process build; ignored"
_SHARDING = "{key}={value} has no effect in this single-process build (sharding/offload is later work); ignored"


def _sharding_rows(node: str, cls: type) -> list[LaterWork]:
    """One row per leaf of an FSDP/Megatron block at ``node``, matching when it differs from the default."""
    rows: list[LaterWork] = []
    default = cls()
    for f in dataclasses.fields(cls):
        value = getattr(default, f.name)
        if dataclasses.is_dataclass(value):
            for sub in dataclasses.fields(value):
                dv = getattr(value, sub.name)
                rows.append(LaterWork(f"{node}.{f.name}.{sub.name}", lambda v, d=dv: v != d, _SHARDING))
        else:
            rows.append(LaterWork(f"{node}.{f.name}", lambda v, d=value: v != d, _SHARDING))
    return rows


_ARR = "actor_rollout_ref"

LATER_WORK: tuple[LaterWork, ...] = (
    LaterWork(f"{_ARR}.rollout.name", lambda v: v in ("vllm", "sglang"),
              "{key}={value} is not available in this build; using hf (or try rollout.name=native)"),
    LaterWork(f"{_ARR}.rollout.tensor_model_parallel_size", lambda v: v > 1,
              "{key}={value}: tensor-parallel rollout is not available in this build; using 1"),
    LaterWork(f"{_ARR}.rollout.gpu_memory_utilization", lambda v: v != 0.5,
              "{key}={value} only applies to vLLM/SGLang rollout; ignored"),
    LaterWork(f"{_ARR}.rollout.multi_turn.enable", lambda v: bool(v), _NOT_HERE,
              lambda c: c.actor_rollout_ref.rollout.multi_turn.get("enable", False)),
    LaterWork(f"{_ARR}.hybrid_engine", lambda v: v is False, "{key}=False is not available; actor and rollout share one process"),
    LaterWork(f"{_ARR}.actor.strategy", lambda v: v == "megatron", "{key}=megatron is not available in this build; using fsdp"),
    LaterWork("critic.strategy", lambda v: v == "megatron", "{key}=megatron is not available in this build; using fsdp"),
    LaterWork(f"{_ARR}.actor.ulysses_sequence_parallel_size", lambda v: v > 1, _NOT_HERE),
    LaterWork("critic.ulysses_sequence_parallel_size", lambda v: v > 1, _NOT_HERE),
    LaterWork(f"{_ARR}.model.use_liger", lambda v: v is True, _NOT_HERE),
    *_sharding_rows(f"{_ARR}.actor.megatron", MegatronConfig),
    *_sharding_rows(f"{_ARR}.ref.megatron", MegatronConfig),
    *_sharding_rows("critic.megatron", MegatronConfig),
)
"""Every accepted-but-not-effective key; the only place this list lives."""


def get_key(cfg: Any, dotted: str) -> Any:
    """Value at a dotted key of a config made of dataclasses and dicts."""
    node = cfg
    for part in dotted.split("."):
        node = node[part] if isinstance(node, dict) else getattr(node, part)
    return node


def later_work_warnings(cfg: Any) -> list[str]:
    """One warning line per :data:`LATER_WORK` row whose value matters, plus skipped loggers."""
    out: list[str] = []
    for row in LATER_WORK:
        value = row.value_of(cfg) if row.value_of else get_key(cfg, row.key)
        if row.matters(value):
            out.append(row.message.format(key=row.key, value=value))
    for name in cfg.trainer.logger:
        if name in VERL_LOGGERS:
            out.append(f"trainer.logger: '{name}' (a verl logger) is not supported by rlforge yet; skipped. "
                       f"rlforge logs to {', '.join(SUPPORTED_LOGGERS)}")
        elif name not in SUPPORTED_LOGGERS:
            close = difflib.get_close_matches(str(name), [*SUPPORTED_LOGGERS, *VERL_LOGGERS], n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"trainer.logger: unknown logger '{name}'.{hint} "
                              f"Valid: {', '.join(SUPPORTED_LOGGERS)}")
    return out


def effective_loggers(cfg: Any) -> list[str]:
    """``trainer.logger`` restricted to :data:`SUPPORTED_LOGGERS`, in order, without duplicates."""
    out: list[str] = []
    for name in cfg.trainer.logger:
        if name in SUPPORTED_LOGGERS and name not in out:
            out.append(name)
    return out

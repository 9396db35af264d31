"""The one table of keys that are accepted (verl compatibility) but not effective in this build.

This build trains and generates in one process (rlforge's ``native`` rollout or ``hf``).  A verl
command line may set vLLM, Megatron, FSDP-sharding or multi-node keys; they are accepted and reported here
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

SUPPORTED_LOGGERS = ("console", "file", "tensorboard", "wandb", "mlflow")
"""``trainer.logger`` entries this build runs (wandb and mlflow when their package is installed)."""

VERL_LOGGERS = ("swanlab", "vemlp_wandb", "clearml", "trackio")
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


MEGATRON_IMPLEMENTED = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                        "virtual_pipeline_model_parallel_size", "sequence_parallel", "param_offload",
                        "optimizer_offload", "dtype")
"""``megatron.*`` fields that ``strategy=megatron`` (PyTorch TP/PP/FSDP2) implements."""

_MEGATRON_LATER = ("{key}={value} is not implemented by strategy=megatron (PyTorch tensor/pipeline parallelism "
                   "and FSDP2, not Megatron-LM); ignored")


def _megatron_rows(node: str, strategy_key: str) -> list[LaterWork]:
    """One row per field of the ``megatron`` block at ``node``: the implemented ones warn when
    set while ``strategy_key`` is not ``megatron``; the others whenever they differ from the default."""
    rows: list[LaterWork] = []
    default = MegatronConfig()
    for f in dataclasses.fields(MegatronConfig):
        d = getattr(default, f.name)
        key = f"{node}.{f.name}"
        if f.name in MEGATRON_IMPLEMENTED:
            rows.append(LaterWork(
                key, lambda v, d=d: v[0] != "megatron" and v[1] != d,
                "{key}={value[1]} only applies with " + strategy_key + "=megatron; ignored",
                lambda c, k=key: (get_key(c, strategy_key), get_key(c, k))))
        else:
            rows.append(LaterWork(key, lambda v, d=d: v != d, _MEGATRON_LATER))
    return rows


_ARR = "actor_rollout_ref"

LATER_WORK: tuple[LaterWork, ...] = (
    LaterWork(f"{_ARR}.rollout.name", lambda v: v in ("vllm", "sglang"),
              "{key}={value} is not available in this build; running rlforge's native engine instead "
              "(hf where the model is not Llama/Qwen-family)"),
    LaterWork(f"{_ARR}.rollout.tensor_model_parallel_size", lambda v: v[0] != "native" and v[1] > 1,
              "{key}={value[1]}: tensor-parallel rollout is not available in this build; using 1 (one model copy "
              "per GPU)",
              lambda c: (c.actor_rollout_ref.rollout.name, c.actor_rollout_ref.rollout.tensor_model_parallel_size)),
    LaterWork(f"{_ARR}.rollout.gpu_memory_utilization", lambda v: v[0] == "hf" and v[1] != 0.5,
              "{key}={value[1]} only applies to the native rollout (rollout.name=native); ignored by hf",
              lambda c: (c.actor_rollout_ref.rollout.name, c.actor_rollout_ref.rollout.gpu_memory_utilization)),
    LaterWork(f"{_ARR}.rollout.calculate_log_probs", lambda v: v[0] == "hf" and v[1],
              "{key}=True only applies to the native rollout; ignored by hf",
              lambda c: (c.actor_rollout_ref.rollout.name, c.actor_rollout_ref.rollout.calculate_log_probs)),
    LaterWork(f"{_ARR}.rollout.enforce_eager", lambda v: v[0] == "hf" and v[1],
              "{key}=True only applies to the native rollout's CUDA graphs; ignored by hf",
              lambda c: (c.actor_rollout_ref.rollout.name, c.actor_rollout_ref.rollout.enforce_eager)),
    LaterWork(f"{_ARR}.rollout.response_length", lambda v: v[0] != v[1],
              "{key}={value[0]}: responses are data.max_response_length={value[1]} tokens long in this build "
              "(set that key instead); ignored",
              lambda c: (c.actor_rollout_ref.rollout.response_length, c.data.max_response_length)),
    LaterWork(f"{_ARR}.rollout.prompt_length", lambda v: v[0] != v[1],
              "{key}={value[0]}: prompts are cut to data.max_prompt_length={value[1]} tokens in this build "
              "(set that key instead); ignored",
              lambda c: (c.actor_rollout_ref.rollout.prompt_length, c.data.max_prompt_length)),
    LaterWork(f"{_ARR}.rollout.dtype", lambda v: v != "bfloat16",
              "{key}={value}: the rollout computes in the trainer's dtype (bfloat16 autocast on a GPU, float32 on "
              "CPU); ignored"),
    LaterWork(f"{_ARR}.rollout.enable_chunked_prefill", lambda v: v is False,
              "{key}=False: the native engine always prefills in chunks of rollout.max_num_batched_tokens; ignored"),
    LaterWork(f"{_ARR}.rollout.over_sample_rate", lambda v: v != 0, _NOT_HERE),
    LaterWork(f"{_ARR}.rollout.multi_stage_wake_up", lambda v: v is True,
              "{key}=True: the native engine wakes in one stage (KV cache and graphs), timed as rollout/wake_s; "
              "ignored"),
    LaterWork(f"{_ARR}.rollout.multi_turn.enable", lambda v: bool(v), _NOT_HERE,
              lambda c: c.actor_rollout_ref.rollout.multi_turn.get("enable", False)),
    LaterWork(f"{_ARR}.hybrid_engine", lambda v: v is False, "{key}=False is not available; actor and rollout share one process"),
    LaterWork(f"{_ARR}.model.use_remove_padding", lambda v: v[0] and v[1] == "megatron",
              "{key}=True has no effect with strategy=megatron (pipeline micro-batches are padded to one shape); "
              "using padded forwards", lambda c: (c.actor_rollout_ref.model.use_remove_padding,
                                                  c.actor_rollout_ref.actor.strategy)),
    LaterWork(f"{_ARR}.actor.ulysses_sequence_parallel_size", lambda v: v > 1, _NOT_HERE),
    LaterWork("critic.ulysses_sequence_parallel_size", lambda v: v > 1, _NOT_HERE),
    LaterWork(f"{_ARR}.model.use_liger", lambda v: v is True, _NOT_HERE),
    LaterWork("reward_model.enable", lambda v: v is True,
              "{key}=True: a reward model is not available in this build; scores come from the rule scorers or "
              "custom_reward_function; ignored"),
    LaterWork(f"{_ARR}.model.fused_kernel_options.impl_backend", lambda v: v == "triton",
              "{key}={value}: this build has only the plain-torch chunked head; using torch"),
    *_megatron_rows(f"{_ARR}.actor.megatron", f"{_ARR}.actor.strategy"),
    *_megatron_rows(f"{_ARR}.ref.megatron", f"{_ARR}.ref.strategy"),
    *_megatron_rows("critic.megatron", "critic.strategy"),
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

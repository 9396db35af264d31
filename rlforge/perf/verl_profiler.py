"""verl's root ``global_profiler`` block, mapped onto rlforge's profiler (:class:`~rlforge.perf.monitor.PerfMonitor`).

verl's keys (``verl/utils/profiler/config.py``, ``ProfilerConfig``): ``tool`` (``nsys`` | ``npu`` | ``torch`` |
``torch_memory``), ``steps`` (global steps to profile; verl profiles nothing without a ``tool``),
``profile_continuous_steps``, ``save_path`` and ``global_tool_config`` (per-tool options).

rlforge records whole steps with ``torch.profiler`` (CPU and CUDA activities), one file per rank and step
(``torch_rank<R>_step<N>.json``).  So ``tool=torch`` with ``steps`` records those steps, as
``trainer.profile_steps`` does, and ``save_path`` is then the folder of those files.  Every other setting
that would change what verl does is named in one warning line by :func:`global_profiler_warning`
(``rlforge/config/later_work.py`` turns them into rows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlforge.errors import ConfigError

KNOWN_KEYS = ("tool", "steps", "profile_continuous_steps", "save_path", "global_tool_config")
"""verl's ``global_profiler`` keys (``_target_``, Hydra metadata, is dropped by the loader)."""

VERL_TOOLS = ("nsys", "npu", "torch", "torch_memory")

VERL_SAVE_PATH = "outputs/profile"
"""verl's default ``global_profiler.save_path`` (its YAML files carry it): silent without a recording."""

VERL_TOOL_CONFIG_DEFAULTS: dict[str, Any] = {
    "nsys.discrete": False,
    "nsys.controller_nsight_options.trace": "cuda,nvtx,cublas,ucx",
    "nsys.controller_nsight_options.cuda-memory-usage": "true",
    "nsys.controller_nsight_options.cuda-graph-trace": "graph",
    "nsys.worker_nsight_options.trace": "cuda,nvtx,cublas,ucx",
    "nsys.worker_nsight_options.cuda-memory-usage": "true",
    "nsys.worker_nsight_options.cuda-graph-trace": "graph",
    "nsys.worker_nsight_options.capture-range": "cudaProfilerApi",
    "nsys.worker_nsight_options.capture-range-end": None,
    "nsys.worker_nsight_options.kill": "none",
    "torch_memory.trace_alloc_max_entries": 100000,
    "torch_memory.stack_depth": 32,
    "torch_memory.context": "all",
    "torch_memory.stacks": "all",
}
"""verl 0.9's ``global_profiler.global_tool_config`` defaults (``_generated_ppo_trainer.yaml``), flattened: a verl
YAML file carries them, so only values that differ are warned about."""


@dataclass(frozen=True)
class TorchProfile:
    """What ``global_profiler`` asks of rlforge's ``torch.profiler`` recording.

    Attributes:
        steps: global steps (1-based) to record; empty = none.
        save_path: folder of the trace files; None = ``<trainer.default_local_dir>/trace``.
    """

    steps: tuple[int, ...] = ()
    save_path: str | None = None


def as_mapping(gp: Any) -> Mapping[str, Any]:
    """The ``global_profiler`` block as a mapping: the schema's dataclass
    (:class:`rlforge.config.profiler.GlobalProfilerConfig`) or a mapping already (None = empty)."""
    if dataclasses.is_dataclass(gp) and not isinstance(gp, type):
        return dataclasses.asdict(gp)
    return gp or {}


def _steps(gp: Mapping[str, Any]) -> tuple[int, ...]:
    steps = gp.get("steps")
    if steps is None:
        return ()
    if isinstance(steps, str | bytes) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                                                 for s in steps):
        raise ConfigError(f"global_profiler.steps={steps!r}: expected null or a list of global steps >= 1, "
                          "e.g. global_profiler.steps=[1,2]")
    return tuple(int(s) for s in steps)


def torch_profile(gp: Any) -> TorchProfile:
    """The steps to record with ``torch.profiler`` and their folder: ``steps`` and ``save_path`` when
    ``tool=torch``, else none.

    Raises:
        ConfigError: ``global_profiler.steps`` is not null or a list of steps >= 1.
    """
    gp = as_mapping(gp)
    steps = _steps(gp)
    if gp.get("tool") != "torch":
        return TorchProfile()
    save = gp.get("save_path")
    return TorchProfile(steps, None if save is None else str(save))


def _flatten(value: Any, prefix: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        return {prefix: value}
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k != "_target_":
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def global_profiler_warning(gp: Any, key: str) -> str:
    """The warning line for ``global_profiler.<key>`` (one of :data:`KNOWN_KEYS`, or ``""`` for the keys
    verl does not have), or ``""`` when the setting takes effect or matches verl's default."""
    gp = as_mapping(gp)
    tool, steps = gp.get("tool"), _steps(gp)
    name = f"global_profiler.{key}"
    if key == "tool" and tool is not None and tool != "torch":
        known = "a verl profiler" if tool in VERL_TOOLS else "not one of verl's tools (" + ", ".join(VERL_TOOLS) + ")"
        return (f"{name}={tool} ({known}) is not available in rlforge, which records torch.profiler traces "
                "(global_profiler.tool=torch, or trainer.profile_steps) and the stage trace (trainer.profile); "
                "nothing is profiled with it")
    if key == "tool" and tool == "torch" and not steps:
        return f"{name}=torch without global_profiler.steps: no step is profiled (set global_profiler.steps=[1])"
    if key == "steps" and steps and tool != "torch":
        return (f"{name}={list(steps)}: no step is profiled without global_profiler.tool=torch (the one tool "
                "rlforge has; verl too profiles nothing without a tool); ignored")
    if key == "save_path" and gp.get("save_path") not in (None, VERL_SAVE_PATH) and not (tool == "torch" and steps):
        return (f"{name}={gp.get('save_path')}: only the torch.profiler files of global_profiler.tool=torch and "
                "global_profiler.steps go there, and none is written; ignored")
    if key == "profile_continuous_steps" and gp.get("profile_continuous_steps"):
        return f"{name}=True: rlforge writes one torch.profiler trace per step and rank; ignored"
    if key == "global_tool_config":
        changed = sorted((k, v) for k, v in _flatten(gp.get("global_tool_config") or {}, "").items()
                         if k not in VERL_TOOL_CONFIG_DEFAULTS or VERL_TOOL_CONFIG_DEFAULTS[k] != v)
        if changed:
            return (f"{', '.join(f'{name}.{k}={v}' for k, v in changed)} configure profilers that rlforge does not run (nsys, "
                    "torch_memory); ignored")
    if key == "":
        unknown = sorted(str(k) for k in gp if k not in KNOWN_KEYS and k != "_target_")
        if unknown:
            return (f"global_profiler: {', '.join('global_profiler.' + k for k in unknown)} not keys of verl's "
                    f"global_profiler ({', '.join(KNOWN_KEYS)}); ignored")
    return ""

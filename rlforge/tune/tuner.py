"""The tuner from a loaded config: plan, apply to the keys the user left free, say what it chose (issue 39).

:func:`tune_at_start` is what ``rlforge train`` calls after its start line; :func:`plan_config` is what
``rlforge tune`` prints.  On a CPU the levers stay as configured (the CPU-safe choice, at once, no probes).
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from typing import Any

from rlforge.tune.apply import apply_levers, config_levers, default_levers, fixed_levers
from rlforge.tune.device import DeviceSpec, detect
from rlforge.tune.plan import Inputs, Plan, choose
from rlforge.tune.shapes import model_shape
from rlforge.tune.workload import Layout, workload_of

log = logging.getLogger("rlforge.tune")


def liger_available(device: DeviceSpec) -> bool:
    """liger-kernel's kernels run on a GPU with the package installed (a fake device counts as a GPU)."""
    return not device.is_cpu and (device.name == "fake" or importlib.util.find_spec("liger_kernel") is not None)


def inputs_for(cfg: Any, device: DeviceSpec, layout: Layout | None = None) -> Inputs:
    """The planner's inputs for ``cfg`` on ``device`` (``layout``: another number of GPUs)."""
    arr = cfg.actor_rollout_ref
    shape = model_shape(str(arr.model.path))
    critic_path = cfg.critic.model.path
    critic = model_shape(str(critic_path)) if critic_path else None
    return Inputs(shape, workload_of(cfg, layout), device, liger_available(device), critic)


def plan_config(cfg: Any, device: DeviceSpec, layout: Layout | None = None, free: bool = False) -> Plan:
    """The plan for ``cfg``: the user's levers fixed (none with ``free``), verl's defaults as the baseline.

    Raises:
        ConfigError: the model cannot fit (:func:`rlforge.tune.plan.cannot_fit_message`), or its shape
            cannot be read.
    """
    fixed = {} if free else fixed_levers(cfg)
    return choose(inputs_for(cfg, device, layout), fixed, default_levers())


def tune_at_start(cfg: Any, device: DeviceSpec | None = None, out: Callable[[str], None] = print) -> list[str]:
    """Choose the free levers of ``cfg`` for this machine, write them into ``cfg``, print the table.

    Returns:
        the written keys as ``key=value`` overrides (for launched worker processes, which then see them
        as set).  Empty on a CPU, where the levers stay as configured.
    """
    from rlforge.tune.report import start_table

    dev = device or detect()
    if dev.is_cpu:
        out("rlforge tune: cpu | levers as configured (auto chooses them on a GPU; `rlforge tune` shows the plan)")
        return []
    before = config_levers(cfg)
    plan = plan_config(cfg, dev)
    written = apply_levers(cfg, plan.chosen.levers)
    text = start_table(plan, before)
    out(text)
    log.info("tuned levers: %s", written)
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in written.items()]

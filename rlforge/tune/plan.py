"""The decision: the fastest setting of the levers whose predicted memory fits every stage (issue 39).

Candidates: every combination of checkpointing, activation offload (with checkpointing), optimizer and
parameter offload and ``reshard_after_forward``; dynamic batching, the padding-free forward and the
chunked head on (off where the strategy cannot use them); liger where it is installed.  For each, the
token budgets are the largest of :data:`BUDGETS` whose stages fit (never below one full row, never above
one mini-batch's tokens), the rollout keeps its KV cache between steps when that fits too.  A lever the
user set keeps the user's value in every candidate (``fixed``).  The fastest by
:func:`rlforge.tune.timing.step_time` wins; :mod:`rlforge.tune.probe` may then measure the best few.

"Fits": every stage's predicted peak is at most ``headroom`` of the device memory (the rest: CUDA
context, NCCL buffers, the allocator's fragmentation, and the model's error).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rlforge.errors import ConfigError
from rlforge.tune.device import DeviceSpec
from rlforge.tune.levers import Levers
from rlforge.tune.memory import StageMemory, minimum_bytes, peak, stage_memory
from rlforge.tune.shapes import ModelShape
from rlforge.tune.timing import StepTime, step_time
from rlforge.tune.workload import Layout, Workload

BUDGETS = (4096, 8192, 12288, 16384, 24576, 32768, 49152, 65536)
"""Token budgets tried (``ppo_max_token_len_per_gpu``, ``log_prob_max_token_len_per_gpu``)."""
HEADROOM = 0.85
"""Fraction of the device memory a stage's predicted peak may take."""
SEARCHED = ("checkpointing", "activation_offload", "optimizer_offload", "param_offload", "reshard")


@dataclass
class Candidate:
    """One setting with its predicted memory per stage and step time."""

    levers: Levers
    memory: dict[str, StageMemory]
    time: StepTime
    fits: bool

    @property
    def peak_bytes(self) -> float:
        return peak(self.memory).total


@dataclass(frozen=True)
class Inputs:
    """What the planner reads: shapes, the step, the device and which levers can take effect."""

    shape: ModelShape
    workload: Workload
    device: DeviceSpec
    liger_available: bool = True
    critic: ModelShape | None = None
    headroom: float = HEADROOM

    @property
    def limit(self) -> float:
        return self.headroom * self.device.memory_bytes


@dataclass
class Plan:
    """The tuner's answer for one run: the chosen setting, the verl-default one, what was tried."""

    chosen: Candidate
    default: Candidate
    device: DeviceSpec
    workload: Workload
    fixed: dict[str, Any] = field(default_factory=dict)
    candidates: list[Candidate] = field(default_factory=list)
    measured_s: dict[Levers, float] = field(default_factory=dict)
    inputs: Inputs | None = None


def evaluate(inp: Inputs, lev: Levers) -> Candidate:
    """Predicted memory and time of ``lev``."""
    mem = stage_memory(inp.shape, inp.workload, lev, inp.device, inp.critic)
    fits = all(s.total <= inp.limit for s in mem.values())
    return Candidate(lev, mem, step_time(inp.shape, inp.workload, lev, inp.device, inp.critic), fits)


def _base(inp: Inputs, fixed: Mapping[str, Any]) -> Levers:
    wl = inp.workload
    packed = wl.strategy != "megatron"
    lev = Levers(dynamic_bsz=True, remove_padding=packed, liger=inp.liger_available, max_num_seqs=max(1024, wl.rows),
                 max_num_batched_tokens=max(8192, wl.prompt_len), gpu_memory_utilization=0.85)
    return replace(lev, **dict(fixed))


def _budgets(wl: Workload, lev: Levers) -> list[int]:
    """The budgets worth trying, largest first (one row at least, one mini-batch at most)."""
    cap = wl.mini_rows * wl.seq_len
    out = sorted({max(wl.seq_len, min(b, cap)) for b in BUDGETS}, reverse=True)
    return out if lev.dynamic_bsz else [lev.token_budget]


def _largest_fitting(inp: Inputs, lev: Levers, fixed: Mapping[str, Any]) -> Candidate | None:
    """``lev`` with the largest budgets that fit, for each ``free_cache_engine`` choice; the faster of
    the two (by the time model), or None if nothing fits."""
    wl = inp.workload
    found: list[Candidate] = []
    for keep_cache in ((False, True) if "free_cache_engine" not in fixed else (not lev.free_cache_engine,)):
        trial = replace(lev, free_cache_engine=not keep_cache)
        train = [lev.token_budget] if "token_budget" in fixed else _budgets(wl, trial)
        infer = [lev.log_prob_budget] if "log_prob_budget" in fixed else _budgets(wl, trial)
        hit = next((c for budget in train for lp in infer
                    if (c := evaluate(inp, replace(trial, token_budget=budget, log_prob_budget=lp))).fits), None)
        if hit is not None:
            found.append(hit)
    return min(found, key=lambda c: c.time.total) if found else None


def candidates(inp: Inputs, fixed: Mapping[str, Any]) -> Iterator[Candidate]:
    """Every searched combination (module doc) with its largest fitting budgets; those that fit nowhere
    are left out."""
    base = _base(inp, fixed)
    free = [name for name in SEARCHED if name not in fixed]
    seen: set[Levers] = set()
    for values in itertools.product((False, True), repeat=len(free)):
        lev = replace(base, **dict(zip(free, values, strict=True)))
        if lev.activation_offload and not lev.checkpointing and "activation_offload" not in fixed:
            continue
        if lev in seen:
            continue
        seen.add(lev)
        cand = _largest_fitting(inp, lev, fixed)
        if cand is not None:
            yield cand


def choose(inp: Inputs, fixed: Mapping[str, Any] | None = None, default: Levers | None = None) -> Plan:
    """The fastest fitting candidate (module doc).

    Raises:
        ConfigError: nothing fits, not even with everything offloaded: one line with the memory model's
            minimum and how many GPUs of this kind would hold it.
    """
    fixed = dict(fixed or {})
    found = sorted(candidates(inp, fixed), key=lambda c: c.time.total)
    if not found:
        raise ConfigError(cannot_fit_message(inp))
    ref = evaluate(inp, replace(default or Levers(), **fixed))
    return Plan(found[0], ref, inp.device, inp.workload, fixed, found, inputs=inp)


def cannot_fit_message(inp: Inputs) -> str:
    """The one line for a model that does not fit on this device even fully offloaded."""
    wl = inp.workload
    need = minimum_bytes(inp.shape, wl)
    more = next((n for n in (2, 4, 8, 16, 32, 64) if n > wl.layout.world and minimum_bytes(
        inp.shape, replace(wl, layout=Layout(n, n if n <= 8 else 8, 1, max(1, n // 8)))) <= inp.limit), None)
    device_gb = need / (inp.limit / inp.device.memory_bytes) / 1e9  # the usable share of a larger device
    hint = (f"it would take tensor parallelism over {more} GPUs (strategy=megatron)" if more
            else f"it needs a device of at least {device_gb:.0f} GB")
    name = "a device given by --device-memory-gb" if inp.device.name == "fake" else inp.device.name
    return (f"the model ({inp.shape.params / 1e9:.2f}B parameters) cannot fit on {name} "
            f"({inp.device.memory_bytes / 1e9:.0f} GB) even with parameter, optimizer and activation offload: "
            f"the memory model's minimum is {need / 1e9:.1f} GB per GPU against {inp.limit / 1e9:.1f} GB usable; {hint}")

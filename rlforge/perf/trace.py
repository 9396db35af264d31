"""The stage timeline of one rank and its export as a Chrome / Perfetto trace.

:class:`Timeline` is the :class:`~rlforge.perf.timer.StageRecorder` the trainer passes to
every ``timed(...)`` block.  :func:`chrome_trace` turns its events into the Trace Event
Format (the JSON object form), which https://ui.perfetto.dev and ``chrome://tracing`` open:

- one complete event (``"ph": "X"``) per stage, ``ts`` and ``dur`` in microseconds,
  ``pid`` = rank, ``tid`` = 0, ``args.step`` = the training step.  ``step`` encloses the
  stages that ran inside it, so the viewer nests them;
- ``process_name`` / ``thread_name`` / ``process_sort_index`` metadata events (``"ph": "M"``);
- counter events (``"ph": "C"``) ``gpu_util_pct`` and ``gpu_memory_gb`` from the GPU
  sampler, one track per rank with one series per device.

Timestamps are wall-clock (Unix epoch) microseconds, so the traces of ranks on one host
line up when loaded together.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlforge.perf.gpu_sampler import GpuSample, Window


@dataclass(frozen=True)
class StageEvent:
    """One timed stage."""

    name: str
    """Stage name (``gen``, ``update_actor``, ..., and ``step`` for the whole step)."""
    start_s: float
    """``time.perf_counter()`` seconds."""
    end_s: float
    """``time.perf_counter()`` seconds."""
    step: int
    """Training step the stage ran in (0 = before the first step, e.g. the first validation)."""


class Timeline:
    """Collects the timed stages of one rank (a :class:`~rlforge.perf.timer.StageRecorder`).

    Args:
        rank: this process's rank (the trace's ``pid``).
        clock: the clock of the recorded times (``time.perf_counter``).
        wall_clock: Unix time in seconds, read once to map ``clock`` to wall-clock time.
    """

    def __init__(self, rank: int = 0, clock: Callable[[], float] = time.perf_counter,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.rank = rank
        self.step = 0
        self.events: list[StageEvent] = []
        self.offset_s = wall_clock() - clock()
        """Add to a ``clock`` time to get Unix seconds."""

    def record(self, name: str, start_s: float, end_s: float) -> None:
        self.events.append(StageEvent(name, start_s, end_s, self.step))

    def last(self, name: str) -> StageEvent | None:
        """The most recent event called ``name``."""
        return next((e for e in reversed(self.events) if e.name == name), None)

    def stage_windows(self, step: int, exclude: Sequence[str] = ("step",)) -> dict[str, list[Window]]:
        """``{stage: [(start_s, end_s), ...]}`` of the stages of ``step``, in first-seen order."""
        out: dict[str, list[Window]] = {}
        for e in self.events:
            if e.step == step and e.name not in exclude:
                out.setdefault(e.name, []).append((e.start_s, e.end_s))
        return out

    def clear(self) -> None:
        self.events.clear()


def _us(t_s: float, offset_s: float) -> float:
    return round((t_s + offset_s) * 1e6, 3)


def chrome_trace(
    events: Sequence[StageEvent], rank: int, offset_s: float, samples: Sequence[GpuSample] = ()
) -> dict[str, Any]:
    """The Trace Event Format object of one rank's stages and GPU samples (see the module doc).

    ``offset_s`` maps the events' and samples' clock to Unix seconds.
    """
    trace: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
        {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
        {"name": "thread_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": "stages"}},
    ]
    for e in events:
        trace.append({
            "name": e.name, "cat": "stage", "ph": "X", "pid": rank, "tid": 0,
            "ts": _us(e.start_s, offset_s), "dur": round((e.end_s - e.start_s) * 1e6, 3), "args": {"step": e.step},
        })
    for s in samples:
        ts = _us(s.time_s, offset_s)
        trace.append({"name": "gpu_util_pct", "ph": "C", "pid": rank, "tid": 0, "ts": ts,
                      "args": {f"gpu{i}": r[0] for i, r in enumerate(s.readings)}})
        trace.append({"name": "gpu_memory_gb", "ph": "C", "pid": rank, "tid": 0, "ts": ts,
                      "args": {f"gpu{i}": round(r[1] / 1e9, 3) for i, r in enumerate(s.readings)}})
    return {"traceEvents": trace, "displayTimeUnit": "ms", "otherData": {"producer": "rlforge", "rank": rank}}


def sample_rows(samples: Sequence[GpuSample], offset_s: float) -> list[dict[str, float]]:
    """One row per (sample, device) for ``trace/gpu_samples_rank<R>.jsonl``: ``time_s`` (Unix
    seconds), ``device``, ``util_pct``, ``memory_used_gb``, ``power_w`` (absent if unknown)."""
    rows = []
    for s in samples:
        for i, (util, mem, power) in enumerate(s.readings):
            row = {"time_s": round(s.time_s + offset_s, 6), "device": i, "util_pct": util,
                   "memory_used_gb": round(mem / 1e9, 4)}
            if power == power:  # not NaN
                row["power_w"] = power
            rows.append(row)
    return rows


def write_json_atomic(path: Path, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` through a temporary file, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj), encoding="utf-8")
    os.replace(tmp, path)

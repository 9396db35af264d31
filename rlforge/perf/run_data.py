"""Reading a run directory for ``rlforge perf report``: metrics, stage traces, GPU samples.

Reads ``RUN_DIR/metrics.jsonl`` (the ``file`` logger) and, when the run had
``trainer.profile=true``, ``RUN_DIR/trace/rank<R>.json`` and ``trace/gpu_samples_rank<R>.jsonl``;
with ``trainer.profile_steps``, each ``trace/torch_rank<R>_step<N>.json`` is summarised (see
:mod:`rlforge.perf.torch_trace`). Every malformed file gets one ``DataError`` naming the file and line.
A resumed run appends to ``metrics.jsonl``; for a step logged twice the last line wins.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlforge.errors import DataError
from rlforge.perf.torch_trace import TraceSummary, finite_number, load_events, summarize

STEP_STAGES = ("gen", "gen_max", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor")
"""Stages timed inside ``timing_s/step``, in the order they run."""
OUTSIDE_STAGES = ("testing",)
"""Stages timed outside the step."""

_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


@dataclass
class RunData:
    """Everything the report reads from one run directory."""

    run_dir: Path
    rows: list[dict[str, float]]
    """One dict per logged step (``step`` included), sorted by step."""
    traces: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Rank -> trace events (``traceEvents`` of ``trace/rank<R>.json``)."""
    samples: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    """Rank -> GPU sample rows of ``trace/gpu_samples_rank<R>.jsonl``."""
    torch_traces: list[TraceSummary] = field(default_factory=list)
    """Summaries of ``trace/torch_rank<R>_step<N>.json`` (``trainer.profile_steps``), by rank then step."""

    @property
    def train_rows(self) -> list[dict[str, float]]:
        return [r for r in self.rows if "timing_s/step" in r]


def _number(v: Any, where: str, key: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float | str):
        raise DataError(f"{where}: metric {key!r} is {v!r}, not a number")
    if isinstance(v, str):
        if v.lower() not in _NON_FINITE:
            raise DataError(f"{where}: metric {key!r} is {v!r}, not a number")
        return _NON_FINITE[v.lower()]
    try:
        return float(v)
    except OverflowError:
        raise DataError(f"{where}: metric {key!r} is an integer too large for a number") from None


def load_metrics(path: Path) -> list[dict[str, float]]:
    """The rows of a ``metrics.jsonl``, one per step (the last line of a step wins), sorted by step.

    Raises:
        DataError: the file is missing or empty, or a line is not a JSON object with an
            integer ``step`` and numeric values (the message names the file and line).
    """
    if not path.is_file():
        raise DataError(f"{path} {'is a directory' if path.is_dir() else 'not found'}: `rlforge perf report` needs "
                        "the metrics of a run made with trainer.logger=[console,file] (or any list with 'file')")
    by_step: dict[int, dict[str, float]] = {}
    for where, obj in _jsonl_objects(path):
        step = obj.get("step")
        if isinstance(step, bool) or not isinstance(step, int):
            raise DataError(f"{where}: no integer 'step' field")
        row = {"step": step, **{k: _number(v, where, k) for k, v in obj.items() if k != "step"}}
        bad = [k for k, v in row.items() if k.startswith("timing_s/") and not (math.isfinite(v) and v >= 0)]
        if bad:
            raise DataError(f"{where}: {bad[0]} is {row[bad[0]]}; a stage time must be a finite number of seconds "
                            ">= 0")
        by_step[step] = row
    if not by_step:
        raise DataError(f"{path} has no metrics (it is empty)")
    return [by_step[s] for s in sorted(by_step)]


def _jsonl_objects(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """``("<path> line <n>", object)`` for each non-blank line of a JSON-lines file.

    Raises:
        DataError: a line is not valid JSON or not a JSON object (the message names file and line).
    """
    with path.open("rb") as fh:  # bytes, decoded line by line, so a bad byte is reported at its line
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path} line {lineno}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not a UTF-8 JSON-lines file ({e.reason})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            except (ValueError, RecursionError) as e:  # a huge integer, deep nesting
                raise DataError(f"{where}: not valid JSON ({e or 'nested too deeply'})") from None
            if not isinstance(obj, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            yield where, obj


def _rank_of(path: Path, prefix: str) -> int | None:
    """The rank of ``<prefix><R>.json`` / ``.jsonl`` (exactly: not ``rank0.backup.json``), else None."""
    m = re.fullmatch(re.escape(prefix) + r"(\d+)\.jsonl?", path.name)
    return int(m.group(1)) if m and path.is_file() else None


def _check_event(e: Any, path: Path, i: int) -> None:
    """A complete ("X") event needs a name, a finite numeric ``ts`` and ``dur`` (microseconds),
    and ``args`` (if any) an object whose ``step`` (if any) is an integer."""
    if not isinstance(e, dict):
        raise DataError(f"{path}: traceEvents[{i}] is not a JSON object")
    if e.get("ph") != "X":
        return
    if not isinstance(e.get("name"), str):
        raise DataError(f"{path}: traceEvents[{i}] has no name (expected the stage's name)")
    args = e.get("args", {})
    if not isinstance(args, dict) or isinstance(args.get("step", 0), bool) or not isinstance(args.get("step", 0), int):
        raise DataError(f"{path}: traceEvents[{i}] ({e['name']!r}) has args={args!r}; expected an object whose "
                        "'step' is an integer")
    for key in ("ts", "dur"):
        v = e.get(key, 0.0 if key == "dur" else None)
        if not finite_number(v) or (key == "dur" and v < 0):
            raise DataError(f"{path}: traceEvents[{i}] ({e.get('name')!r}) has {key}={v!r}; expected a finite number "
                            "of microseconds")


def load_traces(trace_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Rank -> events of every ``rank<R>.json`` in ``trace_dir`` (none: an empty dict)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(trace_dir.glob("rank*.json")):
        rank = _rank_of(path, "rank")
        if rank is None:
            continue
        events = load_events(path)  # the same reading and errors as ``rlforge perf trace``
        for i, e in enumerate(events):
            _check_event(e, path, i)
        out[rank] = events
    return out


def load_samples(trace_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Rank -> rows of every ``gpu_samples_rank<R>.jsonl`` in ``trace_dir``."""
    out: dict[int, list[dict[str, Any]]] = {}
    for path in sorted(trace_dir.glob("gpu_samples_rank*.jsonl")):
        rank = _rank_of(path, "gpu_samples_rank")
        if rank is None:
            continue
        rows = []
        for where, row in _jsonl_objects(path):
            if not {"time_s", "util_pct"} <= set(row):
                raise DataError(f"{where}: expected an object with 'time_s' and 'util_pct'")
            for key in ("time_s", "util_pct", "device"):
                v = row.get(key, 0)
                if isinstance(v, bool) or not isinstance(v, int | float) or (key != "util_pct" and not finite_number(v)):
                    raise DataError(f"{where}: {key}={v!r} is not a{' finite' if key != 'util_pct' else ''} number")
            rows.append(row)
        if rows:  # an empty file (a run that stopped before its first sample) has nothing to plot
            out[rank] = rows
    return out


def load_run(run_dir: str | Path) -> RunData:
    """Read a run directory (see the module doc).

    Raises:
        DataError: ``run_dir`` is not a directory, or a file in it is malformed.
    """
    run = Path(run_dir)
    if not run.is_dir():
        what = "is a file, not a run directory" if run.exists() else "does not exist"
        raise DataError(f"run directory {run} {what} (give trainer.default_local_dir of a run)")
    trace_dir = run / "trace"
    files = sorted(trace_dir.glob("torch_rank*_step*.json"),
                   key=lambda p: [int(n) for n in re.findall(r"\d+", p.name)])  # by rank, then step
    torch_traces = [summarize(p, num_gaps=5, top_kernels=10) for p in files]
    return RunData(run, load_metrics(run / "metrics.jsonl"), load_traces(trace_dir), load_samples(trace_dir),
                   torch_traces)

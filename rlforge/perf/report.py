"""``rlforge perf report RUN_DIR``: where a run's time and idle GPU went.

Reads ``RUN_DIR/metrics.jsonl`` (the ``file`` logger) and, when the run had
``trainer.profile=true``, ``RUN_DIR/trace/rank<R>.json`` and ``trace/gpu_samples_rank<R>.jsonl``;
with ``trainer.profile_steps``, each ``trace/torch_rank<R>_step<N>.json`` gets a section of GPU
idle gaps and kernels (see :mod:`rlforge.perf.torch_trace`).
Writes ``report.md`` and PNG plots to ``RUN_DIR/report/`` (or ``--out``).

The stage table, per stage, over the training steps (rows with ``timing_s/step``):

- ``mean s/step``: the stage's total ``timing_s/<stage>`` divided by the number of steps
  (a stage that ran in only some steps, like ``testing``, is averaged over all steps);
- ``share``: the stage's total time over the total ``timing_s/step`` (``testing`` runs
  outside the step, so its share is relative to, not part of, the step time);
- ``GPU util %``: the mean of ``perf/gpu_util/<stage>`` over the steps that have it;
- ``GPU idle s/step``: ``mean s/step x (1 - util / 100)``, the time per step during which no
  kernel ran (NVML's utilisation is the fraction of time a kernel was running).

``other`` is the step time that no stage covers (batch balancing, metrics, weight sync).
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

from rlforge.errors import DataError, RLForgeError
from rlforge.perf.torch_trace import TraceSummary, finite_number, load_events, summarize
from rlforge.perf.torch_trace import render_markdown as render_torch_trace

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


@dataclass(frozen=True)
class StageRow:
    """One line of the stage table (see the module doc for the definitions)."""

    stage: str
    mean_s: float
    share: float | None
    gpu_util: float | None
    idle_s: float | None


def _mean(values: list[float]) -> float | None:
    vals = [v for v in values if math.isfinite(v)]
    return sum(vals) / len(vals) if vals else None


def stage_table(rows: list[dict[str, float]]) -> list[StageRow]:
    """The stage table of the training ``rows`` (rows with ``timing_s/step``): the stages in
    running order, then ``other``, ``step`` (the whole step) and the stages outside it."""
    train = [r for r in rows if "timing_s/step" in r]
    if not train:
        return []
    n = len(train)
    step_total = sum(r["timing_s/step"] for r in train)

    def row(stage: str, total: float, util_key: str | None) -> StageRow:
        util = _mean([r[util_key] for r in rows if util_key in r]) if util_key else None
        mean_s = total / n
        return StageRow(stage, mean_s, total / step_total if step_total > 0 else None, util,
                        mean_s * (1.0 - util / 100.0) if util is not None else None)

    out = []
    covered = 0.0
    for st in STEP_STAGES:
        key = f"timing_s/{st}"
        if any(key in r for r in train):
            total = sum(r.get(key, 0.0) for r in train)
            covered += total
            out.append(row(st, total, f"perf/gpu_util/{st}"))
    out.append(row("other", max(step_total - covered, 0.0), None))
    out.append(row("step", step_total, "perf/gpu_util/mean"))
    for st in OUTSIDE_STAGES:
        key = f"timing_s/{st}"
        if any(key in r for r in rows):
            out.append(row(st, sum(r.get(key, 0.0) for r in rows), f"perf/gpu_util/{st}"))
    return out


SUMMARY_KEYS: tuple[tuple[str, str, str], ...] = (
    ("time per step (s)", "timing_s/step", "mean"),
    ("throughput (tokens/s/GPU)", "perf/throughput", "mean"),
    ("tokens per hour (all ranks, over the steps)", "perf/tokens_per_hour", "rate"),
    ("GPU utilisation (%)", "perf/gpu_util/mean", "mean"),
    ("GPU idle ratio (samples < 5 % util)", "perf/idle_ratio", "mean"),
    ("MFU, actor update", "perf/mfu/actor", "mean"),
    ("MFU, actor update, verl's count", "perf/mfu/actor_verl", "mean"),
    ("HFU, actor update (with recompute)", "perf/hfu/actor", "mean"),
    ("GPU sampler CPU overhead (s per s)", "perf/gpu_sampler_overhead", "mean"),
    ("peak GPU memory allocated (GB)", "perf/max_memory_allocated_gb", "max"),
)
"""(label, metric, how it is combined over the training steps) of the summary table: ``mean``,
``max``, or ``rate`` (tokens per hour: the steps' ``perf/total_num_tokens`` over their summed
``timing_s/step``, so slow steps weigh as they did; the mean of the per-step rates where the
token counts are absent)."""


def summary(rows: list[dict[str, float]]) -> list[tuple[str, str, float | None]]:
    """``(label, metric, value)`` per :data:`SUMMARY_KEYS`; value None when the metric is absent."""
    train = [r for r in rows if "timing_s/step" in r]
    out = []
    for label, key, how in SUMMARY_KEYS:
        vals = [r[key] for r in train if key in r and math.isfinite(r[key])]
        value = (max(vals) if how == "max" else sum(vals) / len(vals)) if vals else None
        timed = [r for r in train if math.isfinite(r.get("perf/total_num_tokens", math.nan))]
        step_s = sum(r["timing_s/step"] for r in timed)
        if how == "rate" and timed and len(timed) == len(train) and step_s > 0:
            value = sum(r["perf/total_num_tokens"] for r in timed) / step_s * 3600
        out.append((label, key, value))
    return out


def fmt(v: float | None, pct: bool = False) -> str:
    """The report's number format: 4 significant digits; shares as percentages; None as ``-``."""
    if v is None:
        return "-"
    return f"{100 * v:.4g}%" if pct else f"{v:.4g}"


def render_markdown(run: RunData, plots: list[tuple[str, str | None, str]]) -> str:
    """``report.md``: headline, summary, stage table, then each plot (or why it is missing).

    ``plots``: ``(title, file name or None, note)``.
    """
    train = run.train_rows
    table = stage_table(run.rows)
    lines = [f"# Performance report: {run.run_dir}", ""]
    lines += [f"{len(train)} training steps (steps {int(train[0]['step'])}..{int(train[-1]['step'])})"
              if train else "No training steps (no `timing_s/step` in metrics.jsonl).", ""]
    lines += _headline(table)
    lines += ["## Summary", "", "| metric | value | source |", "|---|---|---|"]
    for label, key, value in summary(run.rows):
        lines.append(f"| {label} | {fmt(value)} | `{key}` |")
    lines += ["", "## Stages", "",
              "Mean over the training steps. `share` is of the step time; `GPU idle s/step` = "
              "`mean s/step x (1 - GPU util / 100)`; `other` is step time outside every stage; "
              "`testing` runs outside the step.", "",
              "| stage | mean s/step | share | GPU util % | GPU idle s/step |", "|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r.stage} | {fmt(r.mean_s)} | {fmt(r.share, pct=True)} | {fmt(r.gpu_util)} | {fmt(r.idle_s)} |")
    lines += ["", "## Plots", ""]
    for title, name, note in plots:
        lines += [f"### {title}", "", f"![{title}]({name})" if name else f"Skipped: {note}", ""]
        if name and note:
            lines += [note, ""]
    if run.torch_traces:
        lines += ["## torch.profiler steps", "", "Details: `rlforge perf trace FILE`.", ""]
        lines += [render_torch_trace(t, level=3) for t in run.torch_traces]
    return "\n".join(lines)


def _headline(table: list[StageRow]) -> list[str]:
    stages = [r for r in table if r.stage not in ("step", *OUTSIDE_STAGES)]
    if not stages:
        return []
    top = max(stages, key=lambda r: r.mean_s)
    out = [f"**Most time:** `{top.stage}`, {fmt(top.share, pct=True)} of the step."]
    idle = [r for r in stages if r.idle_s is not None]
    if idle:
        worst = max(idle, key=lambda r: r.idle_s or 0.0)
        out.append(f" **Most idle GPU time:** `{worst.stage}`, {fmt(worst.idle_s)} s per step "
                   f"(GPU util {fmt(worst.gpu_util)} %).")
    else:
        out.append(" No GPU utilisation in the metrics (a CPU run, or no NVML).")
    return ["".join(out), ""]


def write_report(run_dir: str | Path, out_dir: str | Path | None = None) -> Path:
    """Write ``report.md`` and the plots; return the path of ``report.md``.

    Raises:
        RLForgeError: matplotlib is missing (``pip install rlforge[bench]``), or the run
            directory is missing or malformed (see :func:`load_run`).
    """
    try:
        import matplotlib
    except ImportError:
        raise RLForgeError("`rlforge perf report` draws its plots with matplotlib, which is not installed: "
                           "pip install 'rlforge[bench]'") from None
    matplotlib.use("Agg")
    from rlforge.perf.plots import draw_all

    run = load_run(run_dir)
    out = Path(out_dir) if out_dir is not None else run.run_dir / "report"
    try:
        out.mkdir(parents=True, exist_ok=True)
        plots = draw_all(run, out)
        path = out / "report.md"
        path.write_text(render_markdown(run, plots), encoding="utf-8")
    except OSError as e:
        raise RLForgeError(f"rlforge perf report --out {out}: cannot write there ({e.strerror or e})") from None
    return path

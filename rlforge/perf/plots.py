"""The PNG plots of ``rlforge perf report`` (matplotlib, imported by the caller with the Agg backend).

Each ``plot_*`` function draws one figure into ``out`` and returns ``(title, file name, note)``;
when the run lacks the data, the file name is None and the note says what is missing.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator

from rlforge.perf.run_data import OUTSIDE_STAGES, STEP_STAGES, RunData

PlotResult = tuple[str, str | None, str]

_ALL_STAGES = (*STEP_STAGES, "other", *OUTSIDE_STAGES)
_COLORS = {s: plt.get_cmap("tab20")((2 * i) % 20 + (2 * i) // 20) for i, s in enumerate(_ALL_STAGES)}  # dark hues first
TIMELINE_STEPS = 3
"""The timeline plot shows the last this many steps of each rank."""


def _save(fig: Any, out: Path, name: str) -> str:
    for ax in fig.axes:
        if ax.get_xlabel() == "step":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name


def _series(rows: list[dict[str, float]], key: str) -> tuple[list[float], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if key in r]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_stage_breakdown(run: RunData, out: Path) -> PlotResult:
    title = "Stage time per step"
    train = run.train_rows
    if not train:
        return title, None, "no training steps with `timing_s/step` in metrics.jsonl"
    steps = [r["step"] for r in train]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bottom = [0.0] * len(train)
    for st in STEP_STAGES:
        key = f"timing_s/{st}"
        if any(key in r for r in train):
            vals = [r.get(key, 0.0) for r in train]
            ax.bar(steps, vals, bottom=bottom, label=st, color=_COLORS[st])
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    other = [max(r["timing_s/step"] - b, 0.0) for r, b in zip(train, bottom, strict=True)]
    ax.bar(steps, other, bottom=bottom, label="other", color=_COLORS["other"])
    ax.set(xlabel="step", ylabel="seconds", title="Where each step's time goes")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return title, _save(fig, out, "stage_breakdown.png"), ""


def _stage_spans(events: list[dict[str, Any]]) -> list[tuple[str, float, float]]:
    """``(stage, start_us, end_us)`` of the complete events of one rank, ``step`` excluded."""
    return [(e["name"], float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0)))
            for e in events if e.get("ph") == "X" and e.get("name") != "step"]


def plot_gpu_util(run: RunData, out: Path) -> PlotResult:
    title = "GPU utilisation"
    train = run.train_rows
    has_steps = any("perf/gpu_util/mean" in r for r in train)
    if not run.samples and not has_steps:
        return title, None, ("no GPU utilisation: `perf/gpu_util/*` are absent (a run without a GPU or NVML), "
                             "and there is no `trace/gpu_samples_rank<R>.jsonl`")
    panels = int(bool(run.samples)) + int(has_steps)
    fig, axes = plt.subplots(panels, 1, figsize=(10, 3.6 * panels), squeeze=False)
    ax_iter = iter(axes[:, 0])
    if run.samples:
        ax = next(ax_iter)
        t0 = min(float(r["time_s"]) for rows in run.samples.values() for r in rows)
        for rank, rows in sorted(run.samples.items()):
            for dev in sorted({int(r.get("device", 0)) for r in rows}):
                pts = [(float(r["time_s"]) - t0, float(r["util_pct"])) for r in rows if int(r.get("device", 0)) == dev]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], lw=0.8, label=f"rank {rank} gpu {dev}")
        seen: set[str] = set()
        for name, a, b in _stage_spans(run.traces.get(min(run.traces), []) if run.traces else []):
            ax.axvspan(a / 1e6 - t0, b / 1e6 - t0, color=_COLORS.get(name, "0.8"), alpha=0.25, lw=0,
                       label=None if name in seen else name)
            seen.add(name)
        ax.set(xlabel="seconds since the first sample", ylabel="util %", ylim=(-2, 102),
               title="GPU utilisation samples" + (" (bands: rank 0 stages)" if run.traces else ""))
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    if has_steps:
        ax = next(ax_iter)
        ax.plot(*_series(train, "perf/gpu_util/mean"), marker="o", label="mean util %")
        xs, ys = _series(train, "perf/idle_ratio")
        ax.plot(xs, [100 * y for y in ys], marker="s", label="idle % of step")
        ax.set(xlabel="step", ylabel="%", ylim=(-2, 102), title="Per step: mean utilisation and idle share")
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return title, _save(fig, out, "gpu_util.png"), ""


def _last_steps(events: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The complete events of the last ``n`` steps (by ``args.step``)."""
    complete = [e for e in events if e.get("ph") == "X"]
    keep = set(sorted({int(e.get("args", {}).get("step", 0)) for e in complete})[-n:])
    return [e for e in complete if int(e.get("args", {}).get("step", 0)) in keep]


def plot_timeline(run: RunData, out: Path) -> PlotResult:
    title = "Stage timeline"
    if not run.traces:
        return title, None, "no stage trace: run with `trainer.profile=true` to get `trace/rank<R>.json`"
    fig, ax = plt.subplots(figsize=(10, 1.2 + 0.6 * len(run.traces)))
    shown = {rank: _stage_spans(_last_steps(events, TIMELINE_STEPS)) for rank, events in run.traces.items()}
    t0 = min((a for spans in shown.values() for _, a, _ in spans), default=0.0)
    seen: set[str] = set()
    for rank, spans in sorted(shown.items()):
        for name, a, b in spans:
            ax.barh(rank, (b - a) / 1e6, left=(a - t0) / 1e6, color=_COLORS.get(name, "0.6"),
                    label=None if name in seen else name, edgecolor="white", lw=0.3)
            seen.add(name)
    ax.set(xlabel="seconds", yticks=sorted(run.traces), yticklabels=[f"rank {r}" for r in sorted(run.traces)],
           title=f"Stages of the last {TIMELINE_STEPS} steps, per rank")
    ax.invert_yaxis()
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    return title, _save(fig, out, "timeline.png"), ""


def _line_plot(run: RunData, out: Path, title: str, key: str, ylabel: str, name: str) -> PlotResult:
    xs, ys = _series(run.rows, f"{key}/mean")
    if not xs:
        return title, None, f"no `{key}/mean` in metrics.jsonl"
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(xs, ys, marker="o", label="mean")
    lo_x, lo = _series(run.rows, f"{key}/min")
    hi_x, hi = _series(run.rows, f"{key}/max")
    if lo_x == xs and hi_x == xs:
        ax.fill_between(xs, lo, hi, alpha=0.2, label="min..max")
    ax.set(xlabel="step", ylabel=ylabel, title=title)
    ax.legend(fontsize=8)
    return title, _save(fig, out, name), ""


def plot_reward(run: RunData, out: Path) -> PlotResult:
    return _line_plot(run, out, "Reward", "critic/score", "critic/score", "reward.png")


def plot_response_length(run: RunData, out: Path) -> PlotResult:
    return _line_plot(run, out, "Response length", "response_length", "tokens", "response_length.png")


def plot_validation(run: RunData, out: Path) -> PlotResult:
    title = "Validation score"
    keys = sorted({k for r in run.rows for k in r if k.startswith("val-core/") and "/mean@" in k})
    if not keys:
        return title, None, "no `val-core/.../mean@N` metrics (validation did not run)"
    fig, ax = plt.subplots(figsize=(8, 3.6))
    for k in keys:
        ax.plot(*_series(run.rows, k), marker="o", label=k.removeprefix("val-core/"))
    ax.set(xlabel="step", ylabel="score", title=title)
    ax.legend(fontsize=8)
    return title, _save(fig, out, "validation.png"), ""


PLOTS: tuple[Callable[[RunData, Path], PlotResult], ...] = (
    plot_stage_breakdown, plot_gpu_util, plot_timeline, plot_reward, plot_validation, plot_response_length,
)


def draw_all(run: RunData, out: Path) -> list[PlotResult]:
    """Draw every plot of :data:`PLOTS` into ``out``."""
    return [plot(run, out) for plot in PLOTS]

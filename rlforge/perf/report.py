"""``rlforge perf report RUN_DIR``: where a run's time and idle GPU went.

Reads ``RUN_DIR/metrics.jsonl`` (the ``file`` logger) and, when the run had
``trainer.profile=true``, ``RUN_DIR/trace/rank<R>.json`` and ``trace/gpu_samples_rank<R>.jsonl``;
with ``trainer.profile_steps``, each ``trace/torch_rank<R>_step<N>.json`` gets a section of GPU
idle gaps and kernels (see :mod:`rlforge.perf.torch_trace`).
Writes ``report.md`` and PNG plots to ``RUN_DIR/report/`` (or ``--out``).

The stage table, per stage, over the training steps (rows with ``timing_s/step``):

- ``mean s/step``: the stage's total ``timing_s/<stage>`` divided by the number of steps
  (a stage that ran in only some steps, like ``testing``, is averaged over all steps);
- ``share``: the stage's total time over the total ``timing_s/step`` (``-`` for ``testing``, which
  runs outside the step);
- ``GPU util %``: the mean of ``perf/gpu_util/<stage>`` over the steps that have it;
- ``GPU idle s/step``: ``mean s/step x (1 - util / 100)``, the time per step during which no
  kernel ran (NVML's utilisation is the fraction of time a kernel was running).

``other`` is the step time that no stage covers (batch balancing, metrics, weight sync).
A run with partial rollout or rollout correction also gets an off-policy section (the staleness
metrics and the version-gap histogram, :mod:`rlforge.perf.off_policy`).
A resumed run appends to ``metrics.jsonl``; for a step logged twice the last line wins.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from rlforge.errors import RLForgeError
from rlforge.perf.off_policy import off_policy_section
from rlforge.perf.run_data import OUTSIDE_STAGES, STEP_STAGES, RunData, load_run
from rlforge.perf.torch_trace import render_markdown as render_torch_trace


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

    def row(stage: str, total: float, util_key: str | None, in_step: bool = True) -> StageRow:
        util = _mean([r[util_key] for r in rows if util_key in r]) if util_key else None
        mean_s = total / n
        return StageRow(stage, mean_s, total / step_total if step_total > 0 and in_step else None, util,
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
            out.append(row(st, sum(r.get(key, 0.0) for r in rows), f"perf/gpu_util/{st}", in_step=False))
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
              "`testing` runs outside the step (no share).", "",
              "| stage | mean s/step | share | GPU util % | GPU idle s/step |", "|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r.stage} | {fmt(r.mean_s)} | {fmt(r.share, pct=True)} | {fmt(r.gpu_util)} | {fmt(r.idle_s)} |")
    lines += ["", *off_policy_section(run.rows), "## Plots", ""]
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

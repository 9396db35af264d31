"""``rlforge perf trace FILE``: where the GPU sat idle in a ``torch.profiler`` trace, and why.

Reads the Chrome trace that ``trainer.profile_steps=[N]`` writes to
``RUN_DIR/trace/torch_rank<R>_step<N>.json`` (or any ``export_chrome_trace`` file, plain or
``.json.gz``).  All event times are microseconds in the file and milliseconds in the summary.

- **GPU busy**: the union, over all GPUs and streams, of the complete (``"ph": "X"``) events
  with ``cat`` in :data:`DEVICE_CATS`, clipped to the window.
- **Window**: the span of the ``ProfilerStep#N`` annotations when the trace has them (a
  profiler driven by ``prof.step()``), extended to the end of the GPU work that started
  inside it (kernels finish after the CPU launched them).  Otherwise (rlforge's
  ``trainer.profile_steps``) the first to the last complete event of any category, except
  the profiler's own ``Trace`` span, which also covers the profiler's start-up.
- **Gaps**: the window minus GPU busy, longest first.  Each gap is explained by the
  outermost CPU ops (``cat`` in :data:`CPU_CATS`, not nested in another on the same
  thread; ``ProfilerStep#N`` excluded) and the CUDA runtime / driver calls overlapping it,
  each as the top names by overlapped ms, summed over CPU threads.  ``python_function``
  events (``with_stack=True``) are left out: the outermost of them is the script itself.
- **Kernels**: device events by name and by category (:data:`KERNEL_CATEGORIES`);
  ``share`` is of GPU busy time, so kernels overlapping on several streams can sum past 100 %.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from rlforge.errors import DataError

DEVICE_CATS = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
"""Categories of device-side events: the GPU is busy while one runs."""
CPU_CATS = frozenset({"cpu_op", "user_annotation"})
"""Categories of the CPU events that explain a gap."""
RUNTIME_CATS = frozenset({"cuda_runtime", "cuda_driver"})
"""Categories of CUDA API calls (``cudaMalloc``, ``cudaStreamSynchronize``, ``cudaLaunchKernel``...)."""
KERNEL_CATEGORIES: tuple[tuple[str, frozenset[str], tuple[str, ...]], ...] = (
    ("memcpy/memset", frozenset({"gpu_memcpy", "gpu_memset"}), ()),
    ("nccl", frozenset({"kernel"}), ("nccl",)),
    ("attention", frozenset({"kernel"}), ("flash", "fmha", "attn", "attention", "paged")),
    ("gemm/matmul", frozenset({"kernel"}), ("gemm", "nvjet", "cutlass", "sm90_xmma", "cublas")),
)
"""``(category, event cats, lower-case name fragments)``; the first match wins (attention before
gemm: cutlass FMHA kernels are attention); an empty fragment list matches every name."""
OTHER_CATEGORY = "elementwise/other"
NAME_LEN = 80
"""Kernel names are shortened to this many characters."""
_STEP_PREFIX = "ProfilerStep#"


class _Event(NamedTuple):
    name: str
    cat: str
    start: float  # microseconds
    end: float  # microseconds
    thread: tuple[Any, Any]  # (pid, tid)


@dataclass(frozen=True)
class Gap:
    """One interval of the window with no device event running."""

    start_ms: float
    """Offset from the window start, ms."""
    dur_ms: float
    cpu: tuple[tuple[str, float], ...]
    """``(name, overlapped ms)`` of the outermost CPU ops during the gap, most first."""
    runtime: tuple[tuple[str, float], ...]
    """``(name, overlapped ms)`` of the CUDA runtime/driver calls during the gap, most first."""


@dataclass(frozen=True)
class KernelRow:
    """Device events of one name (or one category)."""

    name: str
    count: int
    total_ms: float
    share: float
    """``total_ms`` / GPU busy ms."""


@dataclass(frozen=True)
class TraceSummary:
    """What :func:`summarize` finds in one trace file (times in ms)."""

    path: Path
    window_source: str
    window_ms: float
    busy_ms: float
    idle_ms: float
    num_device_events: int
    """0: a CPU-only trace; busy, gaps and kernels are then empty."""
    gaps: list[Gap]
    """The longest gaps (at least ``min_gap_ms``), longest first."""
    num_gaps: int
    """All gaps of at least ``min_gap_ms``, before keeping the longest."""
    min_gap_ms: float
    kernels: list[KernelRow]
    categories: list[KernelRow]

    @property
    def idle_fraction(self) -> float | None:
        """``idle_ms / window_ms``; None without GPU events."""
        return self.idle_ms / self.window_ms if self.num_device_events and self.window_ms > 0 else None


def load_events(path: str | Path) -> list[dict[str, Any]]:
    """The ``traceEvents`` of a Chrome trace file (``.gz``: gzip-compressed).

    Raises:
        DataError: the file is missing, not (gzipped) JSON, or has no ``traceEvents`` list.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{p} {'is a directory' if p.is_dir() else 'not found'}: expected a torch.profiler "
                        "trace (RUN_DIR/trace/torch_rank<R>_step<N>.json, from trainer.profile_steps)")
    try:
        opener = gzip.open if p.name.endswith(".gz") else open
        with opener(p, "rt", encoding="utf-8") as fh:
            obj = json.load(fh)
    except json.JSONDecodeError as e:
        raise DataError(f"{p} line {e.lineno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not a UTF-8 JSON trace file ({e.reason})") from None
    except (OSError, EOFError) as e:  # bad gzip
        raise DataError(f"{p}: not a JSON trace file ({e})") from None
    except RecursionError:
        raise DataError(f"{p}: not a JSON trace file (nested too deeply)") from None
    except ValueError as e:  # e.g. an integer of more digits than Python converts
        raise DataError(f"{p}: not a JSON trace file ({e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("traceEvents"), list):
        raise DataError(f"{p}: not a Chrome trace (expected a JSON object with a 'traceEvents' list)")
    return obj["traceEvents"]


def _complete(events: list[Any], path: Path) -> list[_Event]:
    out = []
    for i, e in enumerate(events):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        ts, dur = e.get("ts"), e.get("dur")
        if not all(finite_number(v) for v in (ts, dur)) or dur < 0 or not math.isfinite(float(ts) + float(dur)):
            raise DataError(f"{path}: traceEvents[{i}] ({e.get('name')!r}) has ts={ts!r}, dur={dur!r}; "
                            "expected finite numbers of microseconds, dur >= 0")
        out.append(_Event(str(e.get("name", "")), str(e.get("cat", "")), float(ts), float(ts) + float(dur),
                          (str(e.get("pid")), str(e.get("tid")))))
    return out


def finite_number(v: Any) -> bool:
    """A finite number of microseconds (not a bool; an integer too large for a float is not)."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return False
    try:
        return math.isfinite(float(v))
    except OverflowError:
        return False


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _window(events: list[_Event], device: list[_Event]) -> tuple[float, float, str]:
    steps = [e for e in events if e.cat == "user_annotation" and e.name.startswith(_STEP_PREFIX)]
    if steps:
        start, end = min(e.start for e in steps), max(e.end for e in steps)
        end = max([end, *(d.end for d in device if start <= d.start < end)])
        return start, end, f"{len(steps)} `{_STEP_PREFIX}N` span(s) and their GPU work"
    timed = [e for e in events if e.cat != "Trace"] or events
    return min(e.start for e in timed), max(e.end for e in timed), "first to last event"


def _outermost(cpu: list[_Event]) -> list[_Event]:
    """The CPU events not nested in another one of the same thread."""
    out, reach = [], {}
    for e in sorted(cpu, key=lambda e: (e.start, -e.end)):
        if e.start >= reach.get(e.thread, -math.inf):
            out.append(e)
            reach[e.thread] = e.end
    return out


def _overlap(events: list[_Event], a: float, b: float, k: int = 3) -> tuple[tuple[str, float], ...]:
    """The ``k`` names with most overlap (ms) with ``[a, b]`` (microseconds)."""
    by_name: dict[str, float] = defaultdict(float)
    for e in events:
        if e.start < b and e.end > a:
            by_name[e.name] += (min(e.end, b) - max(e.start, a)) / 1e3
    return tuple(sorted(by_name.items(), key=lambda kv: -kv[1])[:k])


def kernel_category(name: str, cat: str) -> str:
    """The :data:`KERNEL_CATEGORIES` category of a device event, else :data:`OTHER_CATEGORY`."""
    low = name.lower()
    for category, cats, fragments in KERNEL_CATEGORIES:
        if cat in cats and (not fragments or any(f in low for f in fragments)):
            return category
    return OTHER_CATEGORY


def _rows(groups: dict[str, list[float]], busy_us: float, top: int | None) -> list[KernelRow]:
    """One row per group of durations (microseconds), most total time first."""
    rows = [KernelRow(n, len(d), sum(d) / 1e3, sum(d) / busy_us if busy_us > 0 else 0.0)
            for n, d in groups.items()]
    return sorted(rows, key=lambda r: -r.total_ms)[:top]


def summarize(path: str | Path, num_gaps: int = 10, top_kernels: int = 15,
              min_gap_ms: float = 0.0) -> TraceSummary:
    """Busy/idle totals, the ``num_gaps`` longest gaps of at least ``min_gap_ms`` ms with their
    CPU explanation, and the ``top_kernels`` kernels by total time (see the module doc).

    Raises:
        DataError: see :func:`load_events`; or a complete event without numeric ``ts``/``dur``.
    """
    p = Path(path)
    events = _complete(load_events(p), p)
    if not events:
        raise DataError(f"{p}: the trace has no complete ('ph': 'X') events")
    device = [e for e in events if e.cat in DEVICE_CATS]
    w0, w1, source = _window(events, device)
    device = [e for e in device if e.end > w0 and e.start < w1]  # GPU work outside the window is not counted
    busy = _union([(max(e.start, w0), min(e.end, w1)) for e in device])
    busy_us = sum(b - a for a, b in busy)
    edges = [w0, *(x for iv in busy for x in iv), w1]
    holes = [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2) if edges[i + 1] > edges[i]]
    holes = sorted((h for h in holes if (h[1] - h[0]) / 1e3 >= min_gap_ms), key=lambda h: h[0] - h[1])
    cpu = _outermost([e for e in events if e.cat in CPU_CATS and not e.name.startswith(_STEP_PREFIX)])
    runtime = [e for e in events if e.cat in RUNTIME_CATS]
    gaps = [Gap((a - w0) / 1e3, (b - a) / 1e3, _overlap(cpu, a, b), _overlap(runtime, a, b))
            for a, b in (holes[:num_gaps] if device else [])]
    by_name: dict[str, list[float]] = defaultdict(list)
    by_cat: dict[str, list[float]] = defaultdict(list)
    for e in device:  # the part of each event inside the window, as for the busy time
        inside = min(e.end, w1) - max(e.start, w0)
        by_name[e.name].append(inside)
        by_cat[kernel_category(e.name, e.cat)].append(inside)
    return TraceSummary(p, source, (w1 - w0) / 1e3, busy_us / 1e3, (w1 - w0 - busy_us) / 1e3, len(device),
                        gaps, len(holes) if device else 0, min_gap_ms, _rows(by_name, busy_us, top_kernels),
                        _rows(by_cat, busy_us, None))


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"  # 66,210 ms, not 6.621e+04


def _code(name: str) -> str:
    name = name.encode("utf-8", "replace").decode("utf-8").replace("\n", " ").replace("\r", " ")
    short = name if len(name) <= NAME_LEN else name[:NAME_LEN - 3] + "..."
    return "`" + short.replace("`", "'").replace("|", "\\|") + "`"


def _names(pairs: tuple[tuple[str, float], ...]) -> str:
    return ", ".join(f"{_code(n)} {_num(ms)}" for n, ms in pairs) or "-"


def render_markdown(s: TraceSummary, level: int = 1) -> str:
    """Markdown text of a summary: totals, the gap table, the category and kernel tables.
    ``level``: the heading level of its title (the sections are one deeper)."""
    h = "#" * level
    lines = [f"{h} GPU idle time: {s.path}", ""]
    if not s.num_device_events:
        return "\n".join(lines + [f"No GPU events in this trace (a CPU-only run): window {_num(s.window_ms)} "
                                  f"ms ({s.window_source}), nothing ran on a GPU.", ""])
    frac = s.idle_fraction
    lines += [f"Window {_num(s.window_ms)} ms ({s.window_source}); GPU busy {_num(s.busy_ms)} ms, "
              f"idle {_num(s.idle_ms)} ms ({_num(100 * frac) if frac is not None else '-'} % idle); "
              f"{s.num_device_events} device events.", "", f"{h}# Longest GPU idle gaps", "",
              f"{len(s.gaps)} of {s.num_gaps} gaps of at least {_num(s.min_gap_ms)} ms. `start` is from the "
              "window start; the CUDA calls and the outermost CPU ops running during the gap, with the ms "
              "they overlap it (summed over CPU threads).", "",
              "| # | start ms | idle ms | CUDA runtime (ms) | CPU ops (ms) |", "|---|---|---|---|---|"]
    lines += [f"| {i} | {_num(g.start_ms)} | {_num(g.dur_ms)} | {_names(g.runtime)} | {_names(g.cpu)} |"
              for i, g in enumerate(s.gaps, start=1)]
    table = ["| count | total ms | share |", "|---|---|---|---|"]
    lines += ["", f"{h}# GPU time by category", "", "Share of GPU busy time (streams overlap, so shares "
              "may add up to more than 100 %).", "", "| category " + table[0], table[1]]
    lines += [f"| {r.name} | {r.count} | {_num(r.total_ms)} | {_num(100 * r.share)}% |" for r in s.categories]
    lines += ["", f"{h}# Top kernels and copies", "", "| kernel " + table[0], table[1]]
    lines += [f"| {_code(r.name)} | {r.count} | {_num(r.total_ms)} | {_num(100 * r.share)}% |"
              for r in s.kernels]
    return "\n".join(lines + [""])

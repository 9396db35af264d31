"""Allocated CUDA memory per stage and step, from a run's ``metrics.jsonl`` (``trainer.logger=[file]``).

    python benchmarks/memory_by_step.py RUN_DIR/metrics.jsonl

Prints one row per step with ``perf/memory_allocated_gb/<stage>`` (GB that stay allocated when the
stage ends, see :mod:`rlforge.perf.memory`) and, per stage, the least-squares growth in MB per step
over the steps after the first (the first step holds one-time allocations: CUDA graphs, caches).
A leak shows as a steady positive slope; allocator noise as a slope near zero.
Exits 1 with one message if the file is missing or holds no memory metrics (a CPU run logs none).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

PREFIX = "perf/memory_allocated_gb/"


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (units of y per unit of x); 0.0 for fewer than 2 points."""
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: memory_by_step.py METRICS_JSONL", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.is_file():
        print(f"memory_by_step: {path}: no such file", file=sys.stderr)
        return 1
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if any(k.startswith(PREFIX) for k in r)]
    if not rows:
        print(f"memory_by_step: {path}: no {PREFIX}* metrics (a CPU run logs none)", file=sys.stderr)
        return 1
    stages = sorted({k[len(PREFIX):] for r in rows for k in r if k.startswith(PREFIX)})
    print("| step | " + " | ".join(stages) + " |")
    print("|---" * (len(stages) + 1) + "|")
    for r in rows:
        cells = [f"{r[PREFIX + s]:.3f}" if PREFIX + s in r else "-" for s in stages]
        print(f"| {r.get('step', '?')} | " + " | ".join(cells) + " |")
    later = rows[1:]
    growth = []
    for s in stages:
        pts = [(float(r["step"]), r[PREFIX + s]) for r in later if PREFIX + s in r and "step" in r]
        growth.append(f"{1e3 * slope([p[0] for p in pts], [p[1] for p in pts]):+.1f}")
    print("| MB/step after step 1 | " + " | ".join(growth) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

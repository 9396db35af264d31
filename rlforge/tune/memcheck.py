"""The memory model against a finished run: predicted peak per stage beside the trainer's
``perf/max_memory_allocated_gb/<stage>`` (the largest over the run's steps), and the relative error.

``rlforge tune --check-memory RUN_DIR`` reads ``RUN_DIR/run_config.yaml`` (the run's resolved config,
every lever as the run used it) and ``RUN_DIR/metrics.jsonl``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlforge.errors import ConfigError
from rlforge.tune.memory import StageMemory

PREFIX = "perf/max_memory_allocated_gb/"


@dataclass(frozen=True)
class MemoryRow:
    """One stage: predicted and measured GB (1e9 bytes) and ``(predicted - measured) / measured``."""

    stage: str
    predicted_gb: float
    measured_gb: float | None

    @property
    def error(self) -> float | None:
        if not self.measured_gb:
            return None
        return (self.predicted_gb - self.measured_gb) / self.measured_gb


def measured_peaks(metrics_file: Path) -> dict[str, float]:
    """Stage -> the largest ``perf/max_memory_allocated_gb/<stage>`` over the rows of a ``metrics.jsonl``.

    Raises:
        ConfigError: the file is missing or a line is not JSON (naming the line).
    """
    if not metrics_file.is_file():
        raise ConfigError(f"{metrics_file}: no such file (run with trainer.logger=[console,file] on a GPU)")
    out: dict[str, float] = {}
    for i, line in enumerate(metrics_file.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ConfigError(f"{metrics_file}:{i}: not a JSON line") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{metrics_file}:{i}: not a JSON object of metrics")
        for key, value in row.items():
            if key.startswith(PREFIX) and isinstance(value, (int, float)):
                stage = key.removeprefix(PREFIX)
                out[stage] = max(out.get(stage, 0.0), float(value))
    if not out:
        raise ConfigError(f"{metrics_file}: no {PREFIX}<stage> metrics (they are logged on a GPU); "
                          "nothing to compare the memory model with")
    return out


def compare(predicted: dict[str, StageMemory], measured: dict[str, float]) -> list[MemoryRow]:
    """One row per predicted stage, in the model's order."""
    return [MemoryRow(name, s.total / 1e9, measured.get(name)) for name, s in predicted.items()]


def markdown(rows: list[MemoryRow], tolerance: float = 0.10) -> str:
    """The comparison as a table; ``ok`` when within ``tolerance`` (issue 39: 10%)."""
    lines = ["| stage | predicted GB | measured GB | error | within 10% |", "|---|---|---|---|---|"]
    for r in rows:
        meas = "-" if r.measured_gb is None else f"{r.measured_gb:.1f}"
        err = "-" if r.error is None else f"{100 * r.error:+.1f}%"
        ok = "-" if r.error is None else ("ok" if abs(r.error) <= tolerance else "NO")
        lines.append(f"| {r.stage} | {r.predicted_gb:.1f} | {meas} | {err} | {ok} |")
    return "\n".join(lines)

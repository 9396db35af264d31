"""Metric loggers selected by ``trainer.logger`` (console, file)."""

from __future__ import annotations

from pathlib import Path

from rlforge.registry import Registry
from rlforge.tracking.console import ConsoleLogger
from rlforge.tracking.file import FileLogger

LOGGERS: Registry[type] = Registry("logger", "trainer.logger")
LOGGERS.register("console")(ConsoleLogger)
LOGGERS.register("file")(FileLogger)


def rotate_metrics_file(directory: Path, filename: str = "metrics.jsonl") -> Path | None:
    """A fresh (not resumed) run keeps an earlier run's ``metrics.jsonl`` as
    ``metrics.<N>.jsonl`` instead of appending to it; returns the new name, if any."""
    path = directory / filename
    if not path.exists() or path.stat().st_size == 0:
        return None
    n = 1
    while (directory / f"metrics.{n}.jsonl").exists():
        n += 1
    target = directory / f"metrics.{n}.jsonl"
    path.rename(target)
    print(f"rlforge: an earlier run's {path} was kept as {target.name}", flush=True)
    return target


class Tracking:
    """Fans one ``log(metrics, step)`` call out to every configured logger."""

    def __init__(self, loggers: list[str], default_local_dir: str | Path) -> None:
        self._loggers = []
        for name in loggers:
            cls = LOGGERS.get(name)
            self._loggers.append(cls(default_local_dir) if cls is FileLogger else cls())

    def log(self, metrics: dict[str, float], step: int) -> None:
        for lg in self._loggers:
            lg.log(metrics, step)

    def close(self) -> None:
        for lg in self._loggers:
            lg.close()


__all__ = ["LOGGERS", "ConsoleLogger", "FileLogger", "Tracking", "rotate_metrics_file"]

"""Metric loggers selected by ``trainer.logger``: console, file, tensorboard, wandb, mlflow.

Each :data:`LOGGERS` entry is a factory ``(run: RunInfo) -> Logger``; the optional
backends (tensorboard, wandb, mlflow) are imported only when chosen.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlforge.registry import Registry
from rlforge.tracking.base import PIP_PACKAGES, Logger, RunInfo, require_logger_package
from rlforge.tracking.console import ConsoleLogger
from rlforge.tracking.file import FileLogger

LOGGERS: Registry[Callable[[RunInfo], Logger]] = Registry("logger", "trainer.logger")


@LOGGERS.register("console")
def _console(run: RunInfo) -> Logger:
    return ConsoleLogger()


@LOGGERS.register("file")
def _file(run: RunInfo) -> Logger:
    return FileLogger(run.directory)


@LOGGERS.register("tensorboard")
def _tensorboard(run: RunInfo) -> Logger:
    from rlforge.tracking.tensorboard_logger import TensorboardLogger

    return TensorboardLogger.from_run(run)


@LOGGERS.register("wandb")
def _wandb(run: RunInfo) -> Logger:
    from rlforge.tracking.wandb_logger import WandbLogger

    return WandbLogger.from_run(run)


@LOGGERS.register("mlflow")
def _mlflow(run: RunInfo) -> Logger:
    from rlforge.tracking.mlflow_logger import MlflowLogger

    return MlflowLogger.from_run(run)


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


def check_loggers(loggers: list[str]) -> None:
    """Raise :class:`~rlforge.errors.ConfigError` for an unknown logger or one whose package
    is missing, before anything slow (model loading) starts."""
    for name in loggers:
        LOGGERS.get(name)
        require_logger_package(name)


class Tracking:
    """Fans one ``log(metrics, step)`` call out to every configured logger.

    Args:
        loggers: ``trainer.logger`` names (already filtered to the supported ones).
        default_local_dir: the run directory.
        project, experiment: ``trainer.project_name`` and ``trainer.experiment_name``.
        config: the resolved config as plain containers, for loggers that record it.

    It also keeps the run's first and last validation (``val-core/*`` metrics with their step)
    for the summary at the end of ``rlforge train``: ``first_validation``, ``last_validation``.
    """

    def __init__(self, loggers: list[str], default_local_dir: str | Path, project: str = "rlforge",
                 experiment: str = "default", config: dict[str, Any] | None = None) -> None:
        run = RunInfo(Path(default_local_dir), project, experiment, config or {})
        self._loggers: list[Logger] = []
        self.first_validation: tuple[int, dict[str, float]] | None = None
        self.last_validation: tuple[int, dict[str, float]] | None = None
        try:
            for name in loggers:
                self._loggers.append(LOGGERS.get(name)(run))
        except BaseException:
            self.close()
            raise

    def log(self, metrics: dict[str, float], step: int) -> None:
        val = {k: v for k, v in metrics.items() if k.startswith("val-core/")}
        if val:
            self.last_validation = (step, val)
            self.first_validation = self.first_validation or self.last_validation
        for lg in self._loggers:
            lg.log(metrics, step)

    def close(self) -> None:
        for lg in self._loggers:
            lg.close()
        self._loggers = []


__all__ = ["LOGGERS", "PIP_PACKAGES", "ConsoleLogger", "FileLogger", "Logger", "RunInfo", "Tracking",
           "check_loggers", "rotate_metrics_file"]

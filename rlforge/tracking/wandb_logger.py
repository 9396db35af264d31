"""``trainer.logger=wandb``: Weights & Biases, offline by default.

The run is created with ``mode=offline`` unless the ``WANDB_MODE`` environment variable
says otherwise (``WANDB_MODE=online`` after ``wandb login``), in
``<trainer.default_local_dir>/wandb/``; ``wandb sync`` uploads an offline run later.
Project and run names are ``trainer.project_name`` and ``trainer.experiment_name``; the
resolved config is the run's config.  Needs the ``wandb`` package.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlforge.tracking.base import RunInfo, require_logger_package


class WandbLogger:
    def __init__(self, run: RunInfo) -> None:
        require_logger_package("wandb")
        import wandb

        directory = Path(run.directory)
        directory.mkdir(parents=True, exist_ok=True)
        self._run: Any = wandb.init(
            project=run.project, name=run.experiment, dir=str(directory), config=run.config or None,
            mode=os.environ.get("WANDB_MODE", "offline"),
        )

    @classmethod
    def from_run(cls, run: RunInfo) -> WandbLogger:
        return cls(run)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._run.finish()

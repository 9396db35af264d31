"""``trainer.logger=mlflow``: MLflow, with a local file store by default.

The tracking URI is ``MLFLOW_TRACKING_URI`` if set, else ``file:<trainer.default_local_dir>/mlruns``
(view with ``mlflow ui --backend-store-uri <that folder>``).  The experiment is
``trainer.project_name``, the run name ``trainer.experiment_name``; the resolved config is
logged as the artifact ``config.json``.  Needs the ``mlflow`` package.

MLflow metric names allow only letters, digits and ``_ - . / :`` and space, so ``@`` becomes
``_at_`` (``val-core/x/reward/mean@1`` -> ``val-core/x/reward/mean_at_1``, as verl does) and any
other character becomes ``_``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from rlforge.tracking.base import RunInfo, require_logger_package

_BAD = re.compile(r"[^0-9A-Za-z_\-./: ]")


def mlflow_key(name: str) -> str:
    """``name`` made a valid MLflow metric key (see the module doc)."""
    return _BAD.sub("_", name.replace("@", "_at_"))


class MlflowLogger:
    def __init__(self, run: RunInfo) -> None:
        require_logger_package("mlflow")
        import mlflow

        self._mlflow: Any = mlflow
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (Path(run.directory).resolve() / "mlruns").as_uri()
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(run.project)
        self._run = mlflow.start_run(run_name=run.experiment)
        if run.config:
            mlflow.log_dict(run.config, "config.json")

    @classmethod
    def from_run(cls, run: RunInfo) -> MlflowLogger:
        return cls(run)

    def log(self, metrics: dict[str, float], step: int) -> None:
        self._mlflow.log_metrics({mlflow_key(k): float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        self._mlflow.end_run()

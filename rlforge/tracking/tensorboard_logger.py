"""``trainer.logger=tensorboard``: scalars in ``<trainer.default_local_dir>/tensorboard/``,
written with ``torch.utils.tensorboard.SummaryWriter`` (needs the ``tensorboard`` package).

View with ``tensorboard --logdir <default_local_dir>/tensorboard``.  Every metric is one
scalar tag with the same name as in ``metrics.jsonl``, at ``global_step = step``.
"""

from __future__ import annotations

from pathlib import Path

from rlforge.tracking.base import RunInfo, require_logger_package


class TensorboardLogger:
    """Writes every metric as a scalar; events are flushed after each step."""

    def __init__(self, directory: str | Path) -> None:
        require_logger_package("tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        self.directory = Path(directory)
        self._writer = SummaryWriter(log_dir=str(self.directory))

    @classmethod
    def from_run(cls, run: RunInfo) -> TensorboardLogger:
        return cls(Path(run.directory) / "tensorboard")

    def log(self, metrics: dict[str, float], step: int) -> None:
        for k, v in sorted(metrics.items()):
            self._writer.add_scalar(k, float(v), global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

"""``trainer.logger=file``: ``metrics.jsonl`` in ``trainer.default_local_dir``.

One JSON object per line and per step: ``{"step": N, "<metric>": value, ...}``.  Lines
are flushed as they are written, so a crash loses nothing already logged.  A resumed run
appends.
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def _jsonable(v: float) -> float | str | None:
    v = float(v)
    return v if math.isfinite(v) else str(v)


class FileLogger:
    def __init__(self, directory: str | Path, filename: str = "metrics.jsonl") -> None:
        self.path = Path(directory) / filename
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in sorted(metrics.items())}}
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()

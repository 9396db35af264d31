"""Stage timers: ``timing_s/<stage>`` metrics, as in verl."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def timed(name: str, metrics: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the block, in seconds, to ``metrics["timing_s/<name>"]``.

    CUDA work is synchronised at both ends so the time belongs to this stage.
    """
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    try:
        yield
    finally:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        key = f"timing_s/{name}"
        metrics[key] = metrics.get(key, 0.0) + time.perf_counter() - t0

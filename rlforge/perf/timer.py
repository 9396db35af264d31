"""Stage timers: ``timing_s/<stage>`` metrics, as in verl, and an optional stage recorder.

A recorder (for example :class:`rlforge.perf.trace.Timeline`) is passed explicitly to
:func:`timed`; it receives the same start and end times as the metric, so the trace, the
per-stage GPU utilisation and ``timing_s/*`` all describe the same intervals.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch


class StageRecorder(Protocol):
    """Receives every timed stage: ``start_s`` and ``end_s`` are ``time.perf_counter()`` seconds."""

    def record(self, name: str, start_s: float, end_s: float) -> None: ...


@contextmanager
def timed(name: str, metrics: dict[str, float], recorder: StageRecorder | None = None) -> Iterator[None]:
    """Add the wall time of the block, in seconds, to ``metrics["timing_s/<name>"]``, and
    pass the interval to ``recorder`` (if given).

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
        t1 = time.perf_counter()
        key = f"timing_s/{name}"
        metrics[key] = metrics.get(key, 0.0) + t1 - t0
        if recorder is not None:
            recorder.record(name, t0, t1)

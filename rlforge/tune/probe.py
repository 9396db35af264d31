"""Probes: measure the best few candidates and keep the measured fastest (issue 39).

:func:`probe_best` is the selection: the ``k`` fastest candidates by the time model, each measured by
``run_probe`` (seconds per step); a candidate whose probe runs out of memory (``torch.OutOfMemoryError``,
or :class:`ProbeOutOfMemory`) is dropped, not fatal; the fastest measured wins, whatever the time model
predicted.  The GPU probe itself, run inside the training process on its own engines, is
:mod:`rlforge.tune.inprocess`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

from rlforge.errors import RLForgeError
from rlforge.tune.levers import Levers
from rlforge.tune.plan import Candidate, Plan


class ProbeOutOfMemory(RLForgeError):
    """A probe that ran out of device memory."""


def is_oom(e: BaseException) -> bool:
    """Whether ``e`` is a device out-of-memory error (or a probe's :class:`ProbeOutOfMemory`)."""
    if isinstance(e, ProbeOutOfMemory):
        return True
    import torch

    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "out of memory" in str(e).lower())


def probe_best(cands: Sequence[Candidate], run_probe: Callable[[Levers], float], k: int = 3,
               max_s: float | None = None) -> tuple[Candidate | None, dict[Levers, float], list[Levers]]:
    """Measure the ``k`` predicted-fastest of ``cands`` (sorted by predicted time here); with ``max_s``,
    no candidate after the first starts once ``max_s`` seconds have passed.

    Returns:
        (the measured fastest or None when every probe ran out of memory, seconds per step of each
        measured candidate, the candidates dropped for running out of memory).  Other errors propagate.
    """
    best = sorted(cands, key=lambda c: c.time.total)[:k]
    measured: dict[Levers, float] = {}
    dropped: list[Levers] = []
    start = time.perf_counter()
    for i, cand in enumerate(best):
        if i and max_s is not None and time.perf_counter() - start > max_s:
            break
        try:
            measured[cand.levers] = float(run_probe(cand.levers))
        except Exception as e:
            if not is_oom(e):
                raise
            dropped.append(cand.levers)
    winner = min((c for c in best if c.levers in measured), key=lambda c: measured[c.levers], default=None)
    return winner, measured, dropped


def probe_plan(plan: Plan, run_probe: Callable[[Levers], float], k: int = 3) -> float:
    """Probe ``plan``'s best ``k`` candidates with ``run_probe``; the measured fastest becomes
    ``plan.chosen`` (every probe dropped: ``plan.chosen`` stays, with one warning on stderr).
    Returns the probing's wall seconds, also printed."""
    start = time.perf_counter()
    winner, measured, dropped = probe_best(plan.candidates, run_probe, k)
    plan.measured_s.update(measured)
    if winner is not None:
        plan.chosen = winner
    else:
        print("rlforge: warning: every probed candidate ran out of memory; keeping the memory model's choice",
              file=sys.stderr, flush=True)
    seconds = time.perf_counter() - start
    print(f"rlforge tune: probed {len(measured) + len(dropped)} candidates in {seconds:.1f} s "
          f"({len(dropped)} ran out of memory and were dropped)")
    return seconds

"""torch's thread count on a CPU run: one thread per core this process may use, shared among the
node's processes, unless the user set ``OMP_NUM_THREADS``.

torch's default (one thread per physical core of the machine) ignores the CPU affinity that
``taskset``, a container's cpuset or a batch scheduler gives the process; on a 2-core machine under
load a step then ran 4.5x slower.  The choice is ``len(os.sched_getaffinity(0)) // processes_per_node``
(at least 1), the same on every run on the same cores.  Launched workers get it as ``OMP_NUM_THREADS``
(:func:`rlforge.trainer.summary.launching`), which ``torchrun`` would otherwise set to 1.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV = "OMP_NUM_THREADS"


@dataclass(frozen=True)
class CpuThreads:
    """Threads per process on a CPU run: ``num``; ``from_env``: the user's ``OMP_NUM_THREADS``."""

    num: int
    from_env: bool

    def describe(self, procs: int) -> str:
        """``4 threads``, ``2 threads each``, with ``, OMP_NUM_THREADS`` when the user chose it."""
        word = "thread" if self.num == 1 else "threads"
        return f"{self.num} {word}{' each' if procs > 1 else ''}{', OMP_NUM_THREADS' if self.from_env else ''}"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; ``os.cpu_count()`` where there is none)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # macOS, Windows
        return max(1, os.cpu_count() or 1)


def pick_cpu_threads(env: Mapping[str, str], cores: int, procs: int) -> CpuThreads:
    """Threads per process for ``procs`` processes on ``cores`` cores: ``cores // procs`` (at least 1),
    or the user's ``OMP_NUM_THREADS`` from ``env`` when it is a positive integer."""
    given = env.get(ENV, "").strip()
    if given.isdigit() and int(given) > 0:
        return CpuThreads(int(given), True)
    return CpuThreads(max(1, cores // max(1, procs)), False)


def apply_cpu_threads(cfg: Any, env: Mapping[str, str] | None = None) -> CpuThreads | None:
    """On a CPU run (:func:`rlforge.config.precision.cpu_run`), set torch's thread count as
    :func:`pick_cpu_threads` chooses (left alone when the user set ``OMP_NUM_THREADS``) and return the
    choice; None on a GPU run (torch's threads are left alone)."""
    import torch

    from rlforge.config.precision import cpu_run

    if not cpu_run(str(cfg.trainer.device)):
        return None
    procs = int(cfg.trainer.n_gpus_per_node)
    choice = pick_cpu_threads(os.environ if env is None else env, usable_cores(), procs)
    if not choice.from_env:
        torch.set_num_threads(choice.num)
    return choice

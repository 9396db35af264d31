"""Probes: run the best few candidates for a step or two and keep the measured fastest (issue 39).

:func:`probe_best` is the selection: the ``k`` fastest candidates by the time model, each measured by
``run_probe`` (seconds per step); a candidate whose probe runs out of memory (``torch.OutOfMemoryError``,
or :class:`ProbeOutOfMemory` from a subprocess) is dropped, not fatal.  :func:`subprocess_probe` is the
GPU probe: ``rlforge train`` for ``steps`` steps of the run's own config and data with the candidate's
levers, in a fresh process, reading ``timing_s/step`` of the last step from its ``metrics.jsonl``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlforge.errors import RLForgeError
from rlforge.tune.levers import KEYS, Levers
from rlforge.tune.plan import Candidate, Plan


class ProbeOutOfMemory(RLForgeError):
    """A probe that ran out of device memory."""


def _is_oom(e: BaseException) -> bool:
    if isinstance(e, ProbeOutOfMemory):
        return True
    import torch

    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "out of memory" in str(e).lower())


def probe_best(cands: Sequence[Candidate], run_probe: Callable[[Levers], float], k: int = 3
               ) -> tuple[Candidate | None, dict[Levers, float], list[Levers]]:
    """Measure the ``k`` predicted-fastest of ``cands`` (sorted by predicted time here).

    Returns:
        (the measured fastest or None when every probe ran out of memory, seconds per step of each
        measured candidate, the candidates dropped for running out of memory).  Other errors propagate.
    """
    best = sorted(cands, key=lambda c: c.time.total)[:k]
    measured: dict[Levers, float] = {}
    dropped: list[Levers] = []
    for cand in best:
        try:
            measured[cand.levers] = float(run_probe(cand.levers))
        except Exception as e:
            if not _is_oom(e):
                raise
            dropped.append(cand.levers)
    winner = min((c for c in best if c.levers in measured), key=lambda c: measured[c.levers], default=None)
    return winner, measured, dropped


def lever_overrides(lev: Levers) -> list[str]:
    """Every lever key of ``lev`` as ``key=value``."""
    out = []
    for name, keys in KEYS.items():
        value = getattr(lev, name)
        out += [f"{k}={str(value).lower() if isinstance(value, bool) else value}" for k in keys]
    return out


def subprocess_probe(cfg: Any, steps: int = 2, timeout_s: float = 600.0) -> Callable[[Levers], float]:
    """A ``run_probe`` for :func:`probe_best` that trains ``steps`` steps of ``cfg`` in a subprocess."""
    from rlforge.config import format_config

    def run(lev: Levers) -> float:
        with tempfile.TemporaryDirectory(prefix="rlforge-probe-") as tmp:
            conf = Path(tmp) / "config.yaml"
            conf.write_text(format_config(cfg))
            cmd = [sys.executable, "-m", "rlforge.cli", "train", "--job", "none", "--config", str(conf),
                   *lever_overrides(lev), f"trainer.total_training_steps={steps}", "trainer.logger=[file]",
                   "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
                   "trainer.resume_mode=disable", f"trainer.default_local_dir={tmp}/run"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0:
                text = done.stdout + done.stderr
                if "out of memory" in text.lower():
                    raise ProbeOutOfMemory(text.strip().splitlines()[-1])
                raise RLForgeError(f"probe failed: {text.strip().splitlines()[-1] if text.strip() else done.returncode}")
            rows = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
            return float(rows[-1]["timing_s/step"])

    return run


def probe_plan(plan: Plan, cfg: Any, k: int = 3, run_probe: Callable[[Levers], float] | None = None) -> float:
    """Probe ``plan``'s best ``k`` candidates; the measured fastest becomes ``plan.chosen``.  Returns the
    probing's wall seconds (printed by ``rlforge tune``)."""
    start = time.perf_counter()
    winner, measured, dropped = probe_best(plan.candidates, run_probe or subprocess_probe(cfg), k)
    plan.measured_s.update(measured)
    if winner is not None:
        plan.chosen = winner
    seconds = time.perf_counter() - start
    print(f"rlforge tune: probed {len(measured) + len(dropped)} candidates in {seconds:.1f} s "
          f"({len(dropped)} ran out of memory and were dropped)")
    return seconds

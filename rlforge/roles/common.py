"""The update loop shared by the actor and the critic."""

from __future__ import annotations

import sys
from collections import defaultdict

from rlforge.batch import Batch
from rlforge.engine import LossFn, TrainEngine
from rlforge.progress import progress_bar


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """Average each metric over the optimizer steps of one RL step."""
    acc: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for k, v in r.items():
            acc[k].append(v)
    return {k: sum(v) / len(v) for k, v in acc.items()}


def run_updates(
    engine: TrainEngine, data: Batch, loss_fn: LossFn, mini_batch_size: int, micro_batch_size: int,
    epochs: int, desc: str, max_token_len: int | None = None,
) -> dict[str, float]:
    """``epochs`` passes over ``data`` in mini-batches, one optimizer step each, with a progress bar
    (on a terminal only: :func:`rlforge.progress.progress_bar`).

    Returns the metrics averaged over the optimizer steps, plus ``lr``.  A step whose
    gradient norm is not finite was skipped by the engine; that is reported on stderr.
    """
    minis = [m for _ in range(epochs) for m in data.split(mini_batch_size)]
    rows: list[dict[str, float]] = []
    for mini in progress_bar(minis, desc=desc, unit="step", leave=False):
        row = engine.train_step(mini, loss_fn, micro_batch_size, max_token_len)
        if row["grad_norm"] != row["grad_norm"] or abs(row["grad_norm"]) == float("inf"):
            print(f"rlforge: warning: {desc}: gradient norm is {row['grad_norm']}; optimizer step skipped",
                  file=sys.stderr, flush=True)
        rows.append(row)
    metrics = mean_metrics(rows)
    metrics["lr"] = engine.lr
    return metrics

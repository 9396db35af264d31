"""The update loop shared by the actor and the critic."""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass

import torch

from rlforge.batch import Batch
from rlforge.engine import LossFn, TrainEngine
from rlforge.engine.base import pop_saved_work
from rlforge.progress import progress_bar


@dataclass
class UpdateResult:
    """What one role update returns.

    Attributes:
        metrics: averaged over the optimizer steps, plus ``lr`` (without the role's prefix).
        saved_work: ``(tokens, Σ s²)`` the shared-prompt layout did not compute, summed over the
            optimizer steps and ranks (``(0, 0)`` without ``share_prompts``;
            :data:`rlforge.engine.base.SAVED_TOKENS`).
        forward: the on-policy update's own forward (``Actor.update(on_policy=True)``):
            ``log_probs`` and ``entropys`` ``(batch, response_len)`` float32 on CPU, 0 past each
            response; None otherwise.
    """

    metrics: dict[str, float]
    saved_work: tuple[float, float] = (0.0, 0.0)
    forward: dict[str, torch.Tensor] | None = None


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
) -> UpdateResult:
    """``epochs`` passes over ``data`` in mini-batches, one optimizer step each, with a progress bar
    (on a terminal only: :func:`rlforge.progress.progress_bar`).

    Returns the metrics averaged over the optimizer steps, plus ``lr``, and the work the steps
    saved (:class:`UpdateResult`).  A step whose
    gradient norm is not finite was skipped by the engine; that is reported on stderr.
    """
    minis = [m for _ in range(epochs) for m in data.split(mini_batch_size)]
    with engine.phase():  # one phase for the whole update (param_offload moves the weights once)
        rows, saved = _steps(engine, minis, loss_fn, micro_batch_size, max_token_len, desc)
    metrics = mean_metrics(rows)
    metrics["lr"] = engine.lr
    return UpdateResult(metrics, saved)


def _steps(engine: TrainEngine, minis: list[Batch], loss_fn: LossFn, micro_batch_size: int,
           max_token_len: int | None, desc: str) -> tuple[list[dict[str, float]], tuple[float, float]]:
    rows: list[dict[str, float]] = []
    saved = (0.0, 0.0)
    for mini in progress_bar(minis, desc=desc, unit="step", leave=False):
        row = engine.train_step(mini, loss_fn, micro_batch_size, max_token_len)
        tok, s2 = pop_saved_work(row)
        saved = (saved[0] + tok, saved[1] + s2)
        if row["grad_norm"] != row["grad_norm"] or abs(row["grad_norm"]) == float("inf"):
            print(f"rlforge: warning: {desc}: gradient norm is {row['grad_norm']}; optimizer step skipped",
                  file=sys.stderr, flush=True)
        rows.append(row)
    return rows, saved

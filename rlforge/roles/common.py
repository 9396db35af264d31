"""The update loop shared by the actor and the critic, and the micro-batching a stage runs with
(:class:`MicroBudget`), which online back-off may lower between two attempts of a step."""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

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


T = TypeVar("T")


class Redo(Protocol):
    """What decides whether a failed attempt of a stage's work is redone (online back-off:
    :class:`rlforge.trainer.backoff.StageBackoff`)."""

    def snapshot(self) -> Any:
        """State taken before an attempt (handed back to :meth:`should_redo`)."""

    def should_redo(self, budget: MicroBudget, batch: Batch, error: Exception, snapshot: Any) -> bool:
        """Whether to redo after ``error``; True only after it changed ``budget`` (or the engine) and
        put back what the attempt changed.  False: the error propagates unchanged."""


@dataclass
class MicroBudget:
    """How one stage splits its batches: ``micro_batch_size`` rows per micro-batch, or, with
    ``max_token_len`` (dynamic batching), a token budget per micro-batch; ``redo`` (None: an error
    propagates at once) may lower them after an out-of-memory error and have the work redone."""

    micro_batch_size: int
    max_token_len: int | None = None
    redo: Redo | None = None

    def run(self, batch: Batch, fn: Callable[[int, int | None], T],
            on_redo: Callable[[], None] | None = None) -> T:
        """``fn(micro_batch_size, max_token_len)`` over ``batch``, redone with the lowered budget
        while :attr:`redo` says so; ``on_redo`` runs before each redo (drop what the failed attempt
        recorded).  The failed attempt's exception (and the frames it holds) is gone before the redo."""
        while True:
            snap = self.redo.snapshot() if self.redo is not None else None
            try:
                return fn(self.micro_batch_size, self.max_token_len)
            except Exception as e:
                if self.redo is None or not self.redo.should_redo(self, batch, e, snap):
                    raise
            if on_redo is not None:
                on_redo()


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """Average each metric over the optimizer steps of one RL step."""
    acc: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for k, v in r.items():
            acc[k].append(v)
    return {k: sum(v) / len(v) for k, v in acc.items()}


def split_meta(batch: Batch) -> dict[str, int]:
    """``num_mini_batches`` of ``batch.meta`` where set (:func:`mini_batches`), for a role's update batch."""
    k = batch.meta.get("num_mini_batches")
    return {} if k is None else {"num_mini_batches": int(k)}


def mini_batches(data: Batch, mini_batch_size: int) -> list[Batch]:
    """``data`` in consecutive mini-batches of ``mini_batch_size`` rows; or, where
    ``data.meta['num_mini_batches']`` is set (:mod:`rlforge.config.sharding`'s ``replica_samples``
    layout, where ranks hold different row counts, possibly none), in exactly that many equal parts,
    so every rank takes the same number of optimizer steps.

    Raises ValueError when the rows do not split into ``num_mini_batches`` equal parts."""
    k = data.meta.get("num_mini_batches")
    if k is None:
        return data.split(mini_batch_size)
    if len(data) % k:
        raise ValueError(f"{len(data)} rows do not split into {k} equal mini-batches")
    size = len(data) // k
    return [data.select(slice(j * size, (j + 1) * size)) for j in range(k)]


def run_updates(
    engine: TrainEngine, data: Batch, loss_fn: LossFn, mini_batch_size: int, budget: MicroBudget,
    epochs: int, desc: str, on_redo: Callable[[], None] | None = None,
) -> UpdateResult:
    """``epochs`` passes over ``data`` in mini-batches, one optimizer step each, with a progress bar
    (on a terminal only: :func:`rlforge.progress.progress_bar`).  Each step's micro-batches follow
    ``budget``; a step that fails and that ``budget.redo`` lowers the budget for is redone alone
    (the engine zeroes the gradients at its start and steps the optimizer only after all its
    micro-batches, so the earlier steps stand and the redone one computes the same update).

    Returns the metrics averaged over the optimizer steps, plus ``lr``, and the work the steps
    saved (:class:`UpdateResult`).  A step whose
    gradient norm is not finite was skipped by the engine; that is reported on stderr.
    """
    minis = [m for _ in range(epochs) for m in mini_batches(data, mini_batch_size)]
    with engine.phase():  # one phase for the whole update (param_offload moves the weights once)
        rows, saved = _steps(engine, minis, loss_fn, budget, desc, on_redo)
    metrics = mean_metrics(rows)
    metrics["lr"] = engine.lr
    return UpdateResult(metrics, saved)


def _steps(engine: TrainEngine, minis: list[Batch], loss_fn: LossFn, budget: MicroBudget, desc: str,
           on_redo: Callable[[], None] | None) -> tuple[list[dict[str, float]], tuple[float, float]]:
    rows: list[dict[str, float]] = []
    saved = (0.0, 0.0)
    for mini in progress_bar(minis, desc=desc, unit="step", leave=False):
        row = budget.run(mini, lambda mbs, mtl, mini=mini: engine.train_step(mini, loss_fn, mbs, mtl), on_redo)
        tok, s2 = pop_saved_work(row)
        saved = (saved[0] + tok, saved[1] + s2)
        if row["grad_norm"] != row["grad_norm"] or abs(row["grad_norm"]) == float("inf"):
            print(f"rlforge: warning: {desc}: gradient norm is {row['grad_norm']}; optimizer step skipped",
                  file=sys.stderr, flush=True)
        rows.append(row)
    return rows, saved

"""Partial rollout in the native engine: continue responses from their tokens, stop the call early.

The trainer's partial rollout (:mod:`rlforge.trainer.partial_rollout`) hands
:meth:`~.engine.NativeRollout.generate` a :class:`Resume`: each row's tokens sampled in earlier
calls (under older weights) and their log-probs, and a stopping rule.  Each row's
:class:`~.sequence.Sequence` starts with those tokens as its output, so the scheduler prefills the
prompt and them together (their KV blocks are not kept between calls: a re-prefill) and samples on
from the next position under the current weights; ``max_new_tokens`` still bounds the whole
response.  The loop asks ``stop(sequences)`` after every step and ends the call as soon as it is
True; the rows still running keep what they have read back (tokens launched and not read are
dropped, :func:`strip_unread`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rlforge.rollout.native.scheduler import PLACEHOLDER
from rlforge.rollout.native.sequence import Sequence


@dataclass
class Resume:
    """``outputs[i]``: row ``i``'s tokens so far (may be empty); ``log_probs[i]``: their rollout
    log-probs (nats, same length; empty lists where the engine does not record them); ``stop``:
    called with the call's sequences (row ``i`` first) after each step, True ends the call."""

    outputs: list[list[int]]
    log_probs: list[list[float]] = field(default_factory=list)
    stop: Callable[[list[Sequence]], bool] = lambda seqs: False


def resume_sequences(seqs: list[Sequence], resume: Resume) -> None:
    """Give each sequence its carried tokens (and log-probs: zeros where none were recorded).
    Raises ValueError when the row counts differ or a row already holds ``max_new_tokens`` tokens."""
    if len(resume.outputs) != len(seqs):
        raise ValueError(f"resume holds {len(resume.outputs)} rows for {len(seqs)} prompts")
    for i, (s, out) in enumerate(zip(seqs, resume.outputs, strict=True)):
        if len(out) >= s.stop_len:
            raise ValueError(f"row {i} already holds {len(out)} tokens, its limit is {s.stop_len}: it is finished")
        s.output_ids = [int(t) for t in out]
        lp = resume.log_probs[i] if resume.log_probs else []
        s.output_log_probs = [float(x) for x in lp] if len(lp) == len(out) else [0.0] * len(out)


def strip_unread(seqs: list[Sequence]) -> None:
    """Drop trailing placeholder tokens (launched, never read back) of unfinished sequences."""
    for s in seqs:
        if s.is_finished:
            continue
        while s.output_ids and s.output_ids[-1] == PLACEHOLDER:
            s.output_ids.pop()
            if len(s.output_log_probs) > len(s.output_ids):
                s.output_log_probs.pop()


class StopHooks:
    """Loop hooks of single-turn generation (nothing between steps) plus the stopping rule ``stop``."""

    def __init__(self, stop: Callable[[list[Sequence]], bool], seqs: list[Sequence]) -> None:
        self._stop, self._seqs = stop, seqs

    def busy(self, steps: Any) -> bool:
        return False

    def pause(self, steps: Any) -> bool:
        return False

    def wait(self, steps: Any) -> None:
        """Never called (:meth:`pause` is False)."""

    def postprocess(self, steps: Any) -> None:
        """Nothing to do between steps."""

    def stop(self, steps: Any) -> bool:
        return self._stop(self._seqs)

    def close(self) -> None:
        """Nothing to release."""

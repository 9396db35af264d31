"""The native engine's steps in flight: what is launched on the device and not read back yet.

:class:`Steps` runs each :class:`~.scheduler.SchedulerOutput` of one ``generate`` call (the
``run`` of ``schedule -> run -> postprocess``) and reads its tokens back into the scheduler.  A
step that mixes prefill chunks and decodes is one forward pass; a step where every sequence only
decodes becomes a *burst* of up to ``max_burst`` decode steps run back to back on the device
(CUDA graphs on GPU), each feeding its sampled tokens to the next, read by the host at once.

Overlapped steps (``overlap_steps``, on by default): the host launches each step before it
reads the one before, so its bookkeeping (reading tokens, EOS and length checks, scheduling,
the next step's inputs and block tables) runs while the GPU works instead of between steps.
Sampled tokens are copied to pinned memory behind an event, so a read waits for its own step
only.  After a mixed step the host holds a placeholder (:data:`~.scheduler.PLACEHOLDER`) for each
sampled token (:meth:`~.scheduler.Scheduler.provisional_update`), schedules and launches the next
step, whose decode rows are fed those tokens on the device, and then writes the real tokens
in (:meth:`~.scheduler.Scheduler.confirm`).  A decode burst is followed by the next burst of the
same sequences, fed its last tokens on the device.  Lengths are known to the host, so a sequence
that reaches its ``stop_len`` is never decoded again; a sequence that samples EOS decodes
through the one step launched after it, whose tokens for it are dropped (at most one extra step
or burst per such sequence, the cost of not waiting).  A burst is not overlapped while a waiting
sequence could be admitted after it (then the host reads first, so admission is not delayed),
nor while a sequence has rejoined the running set outside the scheduler
(:attr:`~.scheduler.Scheduler.rejoined`).  Steps are read back in the order they were launched;
:attr:`Steps.launched` and :attr:`Steps.read` count them, so a caller can tell when every step
that held a sequence has been read (the agent loop resumes a sequence only then).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlforge.errors import RLForgeError
from rlforge.rollout.base import SamplingParams
from rlforge.rollout.native.sampler import NON_FINITE
from rlforge.rollout.native.scheduler import PLACEHOLDER, Scheduler, SchedulerOutput
from rlforge.rollout.native.sequence import Sequence, SequenceStatus


@dataclass
class Burst:
    """A launched decode burst: ``k`` steps of ``out.seqs`` (one token fed each), its tokens
    ``[B, k]`` long on the device, and the host copies (tokens, log-probs or None, finite flag)
    that are valid once ``event`` (None on CPU: already copied) has completed."""

    out: SchedulerOutput
    k: int
    toks: torch.Tensor
    host: tuple[Any, ...]
    event: Any


@dataclass
class Mixed:
    """A launched mixed step: the seq ids of its sampled rows, their row in ``tok`` (``[S]`` long
    on the device, None when nothing is sampled), the host copies (tokens, log-probs or None,
    finite flag) valid once ``event`` has completed, and the placeholders it left on the host."""

    sample_seq_ids: list[int]
    row: dict[int, int]
    tok: torch.Tensor | None
    host: tuple[Any, ...]
    event: Any
    records: list[tuple[Sequence, int]] = field(default_factory=list)


def device_index(rows: list[int], device: torch.device) -> torch.Tensor:
    """``rows`` as an int64 index on ``device``, copied without waiting for the stream
    (``torch.tensor(rows, device=...)`` would wait for every queued step: no overlap)."""
    return torch.tensor(rows, dtype=torch.long).to(device, non_blocking=True)


def pending_rows(seqs: list[Sequence], prev: Mixed | None) -> tuple[list[int], list[int]]:
    """Indices in ``seqs`` of the sequences whose last token is a placeholder of ``prev`` (a
    launched mixed step not read yet), and those tokens' rows in ``prev.tok``."""
    if prev is None:
        return [], []
    rows = [i for i, s in enumerate(seqs) if s.output_ids and s.output_ids[-1] == PLACEHOLDER]
    return rows, [prev.row[seqs[i].seq_id] for i in rows]


def host_lists(host: tuple[Any, ...], event: Any) -> tuple[list[Any], list[float] | None]:
    """Wait for ``event`` (None: the copies are done), then the host copies (tokens, log-probs or
    None, finite flag) as lists (numpy's ``tolist``: several times faster than a tensor's).
    Raises RLForgeError when a sampled logit was not finite."""
    if event is not None:
        event.synchronize()
    toks, lps, finite = host
    if not bool(finite):
        raise RLForgeError(NON_FINITE)
    return toks.numpy().tolist(), None if lps is None else lps.numpy().tolist()


def read_mixed(mx: Mixed, with_log_probs: bool) -> tuple[list[int], list[float] | None]:
    """Wait for ``mx``'s tokens: one per sampled row, in ``mx.sample_seq_ids`` order (and log-probs).
    Raises RLForgeError on non-finite logits."""
    if not mx.sample_seq_ids:
        return [], [] if with_log_probs else None
    return host_lists(mx.host, mx.event)


def read_burst(burst: Burst) -> tuple[dict[int, list[int]], dict[int, list[float]] | None]:
    """Wait for ``burst``'s tokens (not for work queued after it); ``seq_id -> k tokens`` and,
    when computed, their log-probs.  Raises RLForgeError on non-finite logits."""
    tl, ll = host_lists(burst.host, burst.event)
    seqs = burst.out.seqs
    return ({s.seq_id: t for s, t in zip(seqs, tl, strict=True)},
            None if ll is None else {s.seq_id: x for s, x in zip(seqs, ll, strict=True)})


class Steps:
    """Runs the steps of one ``generate`` call and holds the ones launched but not read back.

    Log-probs reach the sequences only with the engine's ``calculate_log_probs`` (a sampler
    may return them anyway).

    Args:
        engine: the :class:`~.engine.NativeRollout` whose ``_launch_mixed`` and ``_launch_burst``
            enqueue the device work; its ``overlap_steps``, ``calculate_log_probs`` and ``device``.
        sched: this call's scheduler.
        runner: this call's :class:`~.model_runner.ModelRunner`.
        params: sampling parameters.
        max_burst: decode steps per burst at most (>= 1).
        on_tokens: called with the number of tokens each read brings back (a progress bar).
    """

    def __init__(self, engine: Any, sched: Scheduler, runner: Any, params: SamplingParams, max_burst: int,
                 on_tokens: Callable[[int], Any]) -> None:
        self.engine, self.sched, self.runner, self.params = engine, sched, runner, params
        self.max_burst, self.on_tokens = max_burst, on_tokens
        self.overlap, self.log_probs, self.device = engine.overlap_steps, engine.calculate_log_probs, engine.device
        self.pend: Burst | None = None  # a launched burst not read yet
        self.pmix: Mixed | None = None  # a launched mixed step whose tokens are placeholders on the host
        self.launched = self.read = 0  # steps (mixed steps and bursts) launched / read back
        self.steps = self.sampled = self.decode_steps = self.bursts = self.overlapped = self.overlapped_mixed = 0
        self.mixed_s = self.decode_s = 0.0  # wall time of mixed (prefill) steps and of decode bursts
        self._t = 0.0  # start of the current step, its scheduling included

    @property
    def in_flight(self) -> bool:
        """True while a launched step has not been read back."""
        return self.pend is not None or self.pmix is not None

    def schedule(self) -> SchedulerOutput | None:
        """The next step: the scheduler's, or None while a launched burst goes on (:meth:`run` then
        launches the burst after it, when it may, and reads it)."""
        self._t = time.perf_counter()
        return self.sched.schedule() if self.pend is None else None

    def run(self, out: SchedulerOutput | None) -> None:
        """Launch ``out`` (a mixed step, or a burst when every sequence decodes) and read back the
        step launched before it (right away without ``overlap_steps``).  Raises RLForgeError on
        non-finite logits."""
        if out is not None and not self.sched.is_pure_decode(out):
            self.steps += 1
            if self.overlap:
                self._launch_mixed(out)
            else:
                self._serial_mixed(out)
            self.mixed_s += time.perf_counter() - self._t
            return
        if out is not None:
            k = self.sched.extend_for_burst(out, self.max_burst)
            self.pend = self.engine._launch_burst(self.runner, out, k, self.params, first_ids=self._last_ids(out.seqs))
            self.launched += 1
            if self.pmix is not None:
                self._confirm()
                self.overlapped_mixed += 1
        nxt = self._next_burst() if self.overlap else None
        self._read_burst()
        self.overlapped += nxt is not None
        self.pend = nxt  # a burst launched for sequences that all ended in the one read is dropped unread at the end

    def flush(self) -> None:
        """Read back what is in flight without launching anything."""
        if self.pend is not None:
            self._t = time.perf_counter()
            self._read_burst()
            self.pend = None
        if self.pmix is not None:
            self._confirm()

    def finish(self) -> None:
        """After the last step: read the tokens of a mixed step still in flight (every sequence
        reached its length in it).  A burst still in flight only holds tokens that are dropped."""
        if self.pmix is not None:
            self._confirm()

    def metrics(self, gen_s: float) -> dict[str, float]:
        """The step counts and times of :meth:`~.engine.NativeRollout.metrics`; ``gen_s``: the loop's wall time."""
        return {
            "rollout/mixed_step_s": self.mixed_s,
            "rollout/decode_s": self.decode_s,
            "rollout/decode_steps": float(self.decode_steps),
            "rollout/decode_bursts": float(self.bursts),
            "rollout/overlapped_bursts": float(self.overlapped),
            "rollout/overlapped_mixed_steps": float(self.overlapped_mixed),
            "rollout/host_s": gen_s - self.mixed_s - self.decode_s,  # outside the steps' own time
            "rollout/batch_occupancy": self.sampled / max(self.steps, 1) / self.sched.config.max_num_seqs,
        }

    # ------------------------------------------------------------------ mixed steps
    def _launch_mixed(self, out: SchedulerOutput) -> None:
        """Launch ``out``, schedule on placeholders for its tokens, then read the mixed step before it."""
        mx = self.engine._launch_mixed(self.runner, out, self.params, self.pmix)
        self.launched += 1
        mx.records = self.sched.provisional_update(out, mx.sample_seq_ids, self.log_probs)
        if self.pmix is not None:
            self._confirm()
            self.overlapped_mixed += 1
        self.pmix = mx

    def _serial_mixed(self, out: SchedulerOutput) -> None:
        """Run ``out`` and read its tokens before anything else is launched."""
        mx = self.engine._launch_mixed(self.runner, out, self.params)
        toks, lps = read_mixed(mx, self.log_probs)
        self.launched += 1
        self.read += 1
        sids = mx.sample_seq_ids
        self.sched.update_burst(out, {sid: [t] for sid, t in zip(sids, toks, strict=True)},
                                None if lps is None or not self.log_probs
                                else {sid: [x] for sid, x in zip(sids, lps, strict=True)})
        self.on_tokens(len(toks))
        self.sampled += len(toks)

    def _confirm(self) -> None:
        """Read the launched mixed step and write its tokens over its placeholders."""
        mx, self.pmix = self.pmix, None
        assert mx is not None
        toks, lps = read_mixed(mx, self.log_probs)
        self.read += 1
        self.sched.confirm(mx.records, toks, lps if self.log_probs else None)
        self.on_tokens(len(toks))
        self.sampled += len(toks)

    def _last_ids(self, seqs: list[Sequence]) -> torch.Tensor | None:
        """``[B]`` long on the device: each sequence's last token, taken from the launched mixed
        step's sampled tokens where the host holds a placeholder; None when no placeholder is pending."""
        prev = self.pmix
        if prev is None:
            return None
        ids = torch.tensor([s.last_token for s in seqs], dtype=torch.long).to(self.device, non_blocking=True)
        rows, src = pending_rows(seqs, prev)
        if rows:
            ids[device_index(rows, self.device)] = prev.tok[device_index(src, self.device)]
        return ids

    # ------------------------------------------------------------------ decode bursts
    def _read_burst(self) -> None:
        """Read the launched burst back into the scheduler."""
        pend = self.pend
        assert pend is not None
        toks, lps = read_burst(pend)
        self.read += 1
        self.sched.update_burst(pend.out, toks, lps if self.log_probs else None)
        self.decode_s += time.perf_counter() - self._t  # ends with a host read: GPU time included
        n = sum(len(t) for t in toks.values())
        self.on_tokens(n)
        self.steps += pend.k
        self.decode_steps += pend.k
        self.sampled += n
        self.bursts += 1

    def _next_burst(self) -> Burst | None:
        """Launch the burst after the launched one before it is read, or return None: when a
        waiting sequence could be admitted after it (room now, or a sequence may end in it), when
        a sequence has rejoined the running set, when every sequence reaches its ``stop_len`` in
        it, or when the free blocks cannot hold even one more step.  The sequences that reach
        ``stop_len`` in it are left out; the burst runs ``min(max_burst, fewest tokens any of the
        rest may still sample)`` steps, fewer while the free blocks cannot hold them (as
        :meth:`Scheduler.extend_for_burst`)."""
        pend, sched = self.pend, self.sched
        assert pend is not None
        k0, seqs0 = pend.k, pend.out.seqs
        rows = [i for i, s in enumerate(seqs0)  # an overlapped `pend` may hold sequences that ended before it
                if s.status is SequenceStatus.RUNNING and s.stop_len - len(s.output_ids) > k0]
        if not rows or sched.rejoined:
            return None
        if sched.waiting and (sched.eos_ids or len(rows) < len(seqs0)
                              or len(sched.running) < sched.config.max_num_seqs):
            return None
        seqs = [seqs0[i] for i in rows]
        k = sched.reserve_burst(seqs, min([self.max_burst] + [s.stop_len - len(s.output_ids) - k0 for s in seqs]),
                                ahead=k0)
        if k < 1:
            return None
        last = pend.toks[:, -1] if len(rows) == len(seqs0) else pend.toks[device_index(rows, self.device), -1]
        self.launched += 1
        return self.engine._launch_burst(self.runner, SchedulerOutput(seqs, [1] * len(seqs)), k, self.params,
                                         first_ids=last, ahead=k0)

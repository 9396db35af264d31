"""Continuous batching with a token budget (vLLM v1 style, one unified step).

Each :meth:`Scheduler.schedule` call returns a :class:`SchedulerOutput`: which sequences run
this step and how many of their not-yet-computed tokens each one feeds (1 for a decode, up
to the rest of the prompt for a (chunked) prefill).  Running sequences are served first;
waiting ones are admitted, first come first served, while blocks, ``max_num_seqs`` and
``max_num_batched_tokens`` allow.  When a running sequence needs a block and none is free,
the most recently admitted running sequence is preempted by recompute: its blocks are freed
and it goes back to the front of the waiting queue, to be prefilled again (prompt and the
tokens generated so far) when blocks free up.  Nothing is ever truncated: a sequence that
cannot fit the whole cache on its own is rejected in :meth:`add`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rlforge.errors import RLForgeError
from rlforge.rollout.native.block_manager import BlockManager
from rlforge.rollout.native.sequence import Sequence, SequenceStatus

PLACEHOLDER = -1
"""The token id :meth:`Scheduler.provisional_update` gives a sequence until its token is read."""


@dataclass
class SchedulerConfig:
    """``max_num_seqs``: sequences per step; ``max_num_batched_tokens``: tokens per step (the
    prefill chunk budget)."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"rollout max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"rollout max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")


@dataclass
class SchedulerOutput:
    """``seqs[i]`` feeds tokens ``[num_computed_tokens, num_computed_tokens + num_new_tokens[i])``."""

    seqs: list[Sequence]
    num_new_tokens: list[int]

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)


@dataclass
class Scheduler:
    config: SchedulerConfig
    block_manager: BlockManager
    eos_ids: frozenset[int]
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    num_preemptions: int = 0
    rejoined: bool = False
    """True while a sequence has joined ``running`` outside :meth:`schedule` (the agent loop's resumed
    turns) and waits to be scheduled: a launched decode burst is then not followed by another."""

    def add(self, seq: Sequence) -> None:
        need = self.block_manager.blocks_for(seq.max_len)
        if need > self.block_manager.num_blocks:
            raise RLForgeError(
                f"one sequence needs {need} KV blocks (prompt {len(seq.prompt_ids)} + "
                f"{seq.max_new_tokens} new tokens) but the cache has {self.block_manager.num_blocks}: "
                "raise actor_rollout_ref.rollout.gpu_memory_utilization (or NativeRollout's num_blocks) or lower "
                "data.max_response_length"
            )
        self.waiting.append(seq)

    @property
    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def _preempt(self, victim: Sequence) -> None:
        self.running.remove(victim)
        self.block_manager.free_seq(victim)
        victim.status = SequenceStatus.WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    def schedule(self) -> SchedulerOutput:
        bm, budget = self.block_manager, self.config.max_num_batched_tokens
        out = SchedulerOutput([], [])
        preempted = False
        for seq in list(self.running):
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this loop
                continue
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            while not bm.can_append(seq, seq.num_computed_tokens + n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is seq:
                    break
            if seq.status is not SequenceStatus.RUNNING:
                continue
            bm.append_slots(seq, seq.num_computed_tokens + n)
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            budget -= n
        deferred: list[Sequence] = []  # waiting on a prompt block another sequence is prefilling now
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if bm.prefix_pending(seq):
                deferred.append(self.waiting.popleft())  # admit it next step, sharing the block
                continue
            if not bm.can_allocate(seq):
                break
            self.waiting.popleft()
            bm.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            budget -= n
        self.waiting.extendleft(reversed(deferred))  # back at the front, in their order
        if not out.seqs and self.has_unfinished:
            raise RLForgeError(
                "the native rollout scheduler cannot make progress: raise num_blocks or max_num_batched_tokens"
            )
        return out

    def is_pure_decode(self, out: SchedulerOutput) -> bool:
        """True when every scheduled sequence feeds exactly its last token (and is sampled)."""
        return bool(out.seqs) and all(
            n == 1 and s.num_computed_tokens + 1 == s.num_tokens for s, n in zip(out.seqs, out.num_new_tokens, strict=True)
        )

    def extend_for_burst(self, out: SchedulerOutput, max_steps: int) -> int:
        """Reserve KV slots so the pure decode step ``out`` can run ``k`` steps on the device
        without the host in between; returns ``k`` (>= 1; the slot of step 1 is already held).

        ``k`` is at most ``max_steps``, at most the fewest new tokens any sequence may still
        sample (up to its ``stop_len``), 1 when a waiting sequence could be admitted now (so it joins next step), and
        shrinks until the free blocks cover every sequence's growth.
        """
        k = min([max_steps] + [s.stop_len - len(s.output_ids) for s in out.seqs])
        if self.waiting and len(self.running) < self.config.max_num_seqs and self.block_manager.can_allocate(
                self.waiting[0]):
            k = 1
        return max(self.reserve_burst(out.seqs, k), 1)

    def reserve_burst(self, seqs: list[Sequence], k: int, ahead: int = 0) -> int:
        """Hold the KV slots of ``k`` decode steps of ``seqs`` after ``ahead`` tokens each has
        sampled on the device and the host has not read yet, shrinking ``k`` while the free
        blocks cannot hold them; returns that ``k``.  With ``ahead=0`` step 1's slot is already
        held (:meth:`schedule`), so ``k`` stays >= 1; otherwise it may come back 0 (nothing held)."""
        bm, floor = self.block_manager, 1 if ahead == 0 else 0
        while k > floor and sum(bm.blocks_for(s.num_tokens + ahead - 1 + k) - len(s.block_table)
                                for s in seqs) > bm.num_free_blocks:
            k -= 1
        if k > 0:
            for s in seqs:
                bm.append_slots(s, s.num_tokens + ahead - 1 + k)
        return k

    def update_burst(
        self, out: SchedulerOutput, sampled: dict[int, list[int]], log_probs: dict[int, list[float]] | None = None
    ) -> list[Sequence]:
        """Advance computed counts, append the sampled tokens (and their log-probs when given),
        and retire finished sequences; returns those that finished.  After ``k`` steps on the
        device (``k = 1`` for a single step) ``sampled[seq_id]`` holds the
        ``k`` tokens sampled in a row, each fed back as the next step's input, so the K/V of
        ``n + k - 1`` tokens were written.  Tokens after a sequence's EOS or ``stop_len`` are
        dropped (their K/V sit in blocks that are freed with the sequence; see :meth:`_finish`).  A sequence that is
        already finished (it ended in the burst before an overlapped one) is skipped."""
        finished = []
        eos = self.eos_ids
        for seq, n in zip(out.seqs, out.num_new_tokens, strict=True):
            if seq.status is SequenceStatus.FINISHED:  # ended (EOS) in the burst before this overlapped one
                continue
            toks = sampled.get(seq.seq_id)
            if toks is None:  # a prefill chunk that did not reach the last token
                seq.num_computed_tokens += n
                self.block_manager.mark_computed(seq)
                continue
            seq.num_computed_tokens += n + len(toks) - 1
            keep = max(min(len(toks), seq.stop_len - len(seq.output_ids)), 0)  # the length limit
            if not eos.isdisjoint(toks[:keep]):  # cut after the first EOS
                keep = next(j for j, tok in enumerate(toks) if tok in eos) + 1
            seq.output_ids.extend(toks[:keep])
            if log_probs is not None:
                seq.output_log_probs.extend(log_probs[seq.seq_id][:keep])
            if keep < len(toks) or toks[keep - 1] in eos or len(seq.output_ids) >= seq.stop_len:
                self._finish(seq)
                finished.append(seq)
            else:
                self.block_manager.mark_computed(seq)
        if finished:  # one pass, in order (running[-1] is the preemption victim)
            self.running = [s for s in self.running if s.status is not SequenceStatus.FINISHED]
        return finished

    def provisional_update(self, out: SchedulerOutput, sampled_ids: list[int],
                           with_log_probs: bool = False) -> list[tuple[Sequence, int]]:
        """As :meth:`update_burst` with one token each, for a step whose sampled tokens are still on the device: each
        sequence of ``sampled_ids`` gets :data:`PLACEHOLDER` as its next token (and a 0.0
        log-prob with ``with_log_probs``), so the next step can be scheduled now; the ones that
        reach ``stop_len`` finish.  Returns ``(sequence, index in output_ids)`` of each
        placeholder, in ``sampled_ids`` order, for :meth:`confirm`."""
        sampled = set(sampled_ids)
        by_id: dict[int, tuple[Sequence, int]] = {}
        finished = False
        for seq, n in zip(out.seqs, out.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            if seq.seq_id not in sampled:  # a prefill chunk that did not reach the last token
                self.block_manager.mark_computed(seq)
                continue
            seq.output_ids.append(PLACEHOLDER)
            if with_log_probs:
                seq.output_log_probs.append(0.0)
            by_id[seq.seq_id] = (seq, len(seq.output_ids) - 1)
            if len(seq.output_ids) >= seq.stop_len:
                self._finish(seq)
                finished = True
            else:
                self.block_manager.mark_computed(seq)
        if finished:
            self.running = [s for s in self.running if s.status is not SequenceStatus.FINISHED]
        return [by_id[sid] for sid in sampled_ids]

    def confirm(self, records: list[tuple[Sequence, int]], tokens: list[int],
                log_probs: list[float] | None = None) -> None:
        """Write the tokens read back for :meth:`provisional_update`'s placeholders.  A sequence
        whose token is an EOS ends there: what it was given after it (the placeholders and burst
        tokens of steps launched since) is dropped, and it finishes (leaving the waiting queue if it
        was preempted meanwhile).  A record whose placeholder was already dropped (an earlier EOS)
        is skipped."""
        eos, finished = self.eos_ids, False
        for (seq, i), tok, lp in zip(records, tokens, log_probs if log_probs is not None else tokens, strict=True):
            if i >= len(seq.output_ids) or seq.output_ids[i] != PLACEHOLDER:
                continue
            seq.output_ids[i] = tok
            if log_probs is not None:
                seq.output_log_probs[i] = lp
            if tok in eos:
                del seq.output_ids[i + 1:]
                del seq.output_log_probs[i + 1:]
                if seq.status is SequenceStatus.WAITING:  # preempted since its step was launched
                    self.waiting.remove(seq)
                if seq.status is not SequenceStatus.FINISHED:
                    self._finish(seq)
                    finished = True
        if finished:
            self.running = [s for s in self.running if s.status is not SequenceStatus.FINISHED]

    def _finish(self, seq: Sequence) -> None:
        """``seq`` stops sampling (EOS or ``stop_len``): it is marked FINISHED and its blocks are
        freed; the caller drops it from ``running``.  The agent loop parks it instead."""
        seq.status = SequenceStatus.FINISHED
        self.block_manager.free_seq(seq)

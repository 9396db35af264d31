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

    def add(self, seq: Sequence) -> None:
        need = self.block_manager.blocks_for(seq.max_len)
        if need > self.block_manager.num_blocks:
            raise RLForgeError(
                f"one sequence needs {need} KV blocks (prompt {len(seq.prompt_ids)} + "
                f"{seq.max_new_tokens} new tokens) but the cache has {self.block_manager.num_blocks}: "
                "raise the rollout num_blocks / memory fraction or lower data.max_response_length"
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
        while self.waiting and not preempted and budget > 0 and len(self.running) < self.config.max_num_seqs:
            seq = self.waiting[0]
            if bm.prefix_pending(seq) or not bm.can_allocate(seq):
                break
            self.waiting.popleft()
            bm.allocate(seq)
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            out.seqs.append(seq)
            out.num_new_tokens.append(n)
            budget -= n
        if not out.seqs and self.has_unfinished:
            raise RLForgeError(
                "the native rollout scheduler cannot make progress: raise num_blocks or max_num_batched_tokens"
            )
        return out

    def update(self, out: SchedulerOutput, sampled: dict[int, int]) -> list[Sequence]:
        """Advance computed counts, append the sampled tokens (``seq_id -> token``), and
        retire finished sequences; returns those that finished this step."""
        finished = []
        for seq, n in zip(out.seqs, out.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            self.block_manager.mark_computed(seq)
            tok = sampled.get(seq.seq_id)
            if tok is None:  # a prefill chunk that did not reach the last token
                continue
            seq.output_ids.append(tok)
            if tok in self.eos_ids or len(seq.output_ids) >= seq.max_new_tokens:
                seq.status = SequenceStatus.FINISHED
                self.running.remove(seq)
                self.block_manager.free_seq(seq)
                finished.append(seq)
        return finished

"""Per-request state of the native engine: one :class:`Sequence` per row to sample."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    """One prompt and its growing response.

    ``num_computed_tokens`` counts leading tokens (prompt, then generated) whose K/V are in
    the cache; ``num_cached_tokens`` is how many of those came from the prefix cache at the
    last admission.  ``block_table[i]`` holds tokens ``[i*block_size, (i+1)*block_size)``.
    ``stop_len``: the length of ``output_ids`` at which sampling stops: ``max_new_tokens``, or in
    the agent loop the end of the current model turn (:class:`~rlforge.rollout.multi_turn.native.AgentScheduler`).
    """

    seq_id: int
    prompt_ids: list[int]
    max_new_tokens: int
    output_ids: list[int] = field(default_factory=list)
    output_log_probs: list[float] = field(default_factory=list)
    status: SequenceStatus = SequenceStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    stop_len: int = field(init=False)

    def __post_init__(self) -> None:
        self.stop_len = self.max_new_tokens

    @property
    def token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def max_len(self) -> int:
        """Tokens this sequence can ever hold (prompt + all new tokens)."""
        return len(self.prompt_ids) + self.max_new_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

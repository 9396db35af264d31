"""A mixin for scripted multi-turn rollouts in the tests: before each engine step it records, in the
engine's sampling order, ``(seq id, tokens of the current model turn so far)`` of the sequences that
sample in that step (``self._order``, read from ``self._j`` on), so a test's sampler can emit each
sequence's scripted token.  The class using it says where a sequence's current turn starts."""

from __future__ import annotations


class TurnPlan:
    _order: list[tuple[int, int]]
    _j: int

    def _turn_start_of(self, seq_id: int) -> int:
        """Index in ``seq.output_ids`` where the sequence's current model turn starts."""
        raise NotImplementedError

    def _plan(self, seqs) -> None:
        self._order = [(s.seq_id, len(s.output_ids) - self._turn_start_of(s.seq_id)) for s in seqs]
        self._j = 0

    def _mixed_step(self, runner, out, params):
        self._plan([s for s, n in zip(out.seqs, out.num_new_tokens, strict=True)
                    if s.num_computed_tokens + n == s.num_tokens])
        return super()._mixed_step(runner, out, params)

    def _decode_burst(self, runner, out, k, params):
        self._plan(out.seqs)
        return super()._decode_burst(runner, out, k, params)

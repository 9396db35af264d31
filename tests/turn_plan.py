"""A mixin for scripted multi-turn rollouts in the tests: before each engine step is launched it
records, in the engine's sampling order, ``(seq id, tokens of the current model turn so far)`` of the
sequences that sample in that step (``self._order``, read from ``self._j`` on), so a test's sampler can
emit each sequence's scripted token.  Tokens the host has not read yet count: placeholders of a launched
mixed step, and the ``ahead`` tokens of a launched burst that the next one follows.  The class using it
says where a sequence's current turn starts."""

from __future__ import annotations


class TurnPlan:
    _order: list[tuple[int, int]]
    _j: int

    def _turn_start_of(self, seq_id: int) -> int:
        """Index in ``seq.output_ids`` where the sequence's current model turn starts."""
        raise NotImplementedError

    def _plan(self, seqs, ahead: int = 0) -> None:
        self._order = [(s.seq_id, len(s.output_ids) + ahead - self._turn_start_of(s.seq_id)) for s in seqs]
        self._j = 0

    def _launch_mixed(self, runner, out, params, prev=None):
        self._plan([s for s, n in zip(out.seqs, out.num_new_tokens, strict=True)
                    if s.num_computed_tokens + n == s.num_tokens])
        return super()._launch_mixed(runner, out, params, prev)

    def _launch_burst(self, runner, out, k, params, first_ids=None, ahead=0):
        self._plan(out.seqs, ahead)
        return super()._launch_burst(runner, out, k, params, first_ids=first_ids, ahead=ahead)

"""Multi-turn, tool-using rollouts (``actor_rollout_ref.rollout.multi_turn.*``, verl's keys).

Files read as the loop: :mod:`.config` (the checked keys), :mod:`.parser` (Hermes tool calls),
:mod:`.executor` (concurrent tool calls under time and output limits), :mod:`.render` (inserted
turns through the chat template), :mod:`.conversation` (one sample's state at a turn's end),
:mod:`.native` (the agent loop on the native engine, KV cache kept across turns), :mod:`.metrics`.
"""

from rlforge.rollout.multi_turn.config import MultiTurnConfig

__all__ = ["MultiTurnConfig"]

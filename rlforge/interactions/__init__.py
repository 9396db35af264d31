"""Interactions: a scripted user turn between model turns (``rollout.multi_turn.interaction_config_path``).

:class:`BaseInteraction` has verl's shape; the built-in ``gsm8k`` (:mod:`.gsm8k`) checks the answer and
asks for another try when it is wrong.
"""

from rlforge.interactions import gsm8k as _gsm8k  # noqa: F401,E402  (registers)
from rlforge.interactions.base import BaseInteraction
from rlforge.interactions.registry import INTERACTIONS, load_interactions

__all__ = ["INTERACTIONS", "BaseInteraction", "load_interactions"]

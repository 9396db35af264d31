"""Rollout backends behind one interface (:class:`Rollout`), selected by ``rollout.name``."""

from rlforge.rollout import hf as _hf  # noqa: F401  (registers "hf")
from rlforge.rollout import native as _native  # noqa: F401  (registers "native")
from rlforge.rollout.base import ROLLOUTS, Rollout, SamplingParams, assemble, response_mask_from_eos

__all__ = ["ROLLOUTS", "Rollout", "SamplingParams", "assemble", "response_mask_from_eos"]

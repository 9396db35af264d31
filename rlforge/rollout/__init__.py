"""Rollout backends behind one interface (:class:`Rollout`), selected by ``rollout.name``.

The names below load on first use (PEP 562), with both backends registered in ``ROLLOUTS``:
importing a torch-free submodule (:mod:`rlforge.rollout.multi_turn.config`, which validation
reads) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlforge.rollout.base import ROLLOUTS, Rollout, SamplingParams, assemble, response_mask_from_eos

__all__ = ["ROLLOUTS", "Rollout", "SamplingParams", "assemble", "response_mask_from_eos"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rlforge.rollout import base, hf, native  # noqa: F401  (hf and native register themselves)

    for n in __all__:
        globals()[n] = getattr(base, n)
    return globals()[name]

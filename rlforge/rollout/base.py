"""The rollout interface: prompts in, sampled responses out.

A backend receives a :class:`~rlforge.batch.Batch` of left-padded prompts
(``input_ids``, ``attention_mask``, ``position_ids``: ``(batch, prompt_len)``), one row per
sample to draw (the trainer has already repeated each prompt ``rollout.n`` times), and
returns a batch with

* ``prompts`` ``(batch, prompt_len)``: the prompt ids as given;
* ``responses`` ``(batch, response_len)``: sampled ids, padded with the pad token after EOS;
* ``response_mask`` ``(batch, response_len)`` int64: 1 up to and including the first EOS;
* ``input_ids``, ``attention_mask``, ``position_ids`` ``(batch, prompt_len + response_len)``.

``response_len`` is at most ``data.max_response_length``.  The backend must use the
actor's current weights every step: the built-in backends read the actor's module itself (the
native one refreshes its packed copies of the weights before each generation).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.registry import Registry


@dataclass(frozen=True)
class SamplingParams:
    """Sampling settings of one ``generate`` call.

    ``temperature`` 0 or ``do_sample=False`` means greedy; ``top_k`` -1 and ``top_p`` 1.0 are off.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = True
    max_new_tokens: int = 512

    def __post_init__(self) -> None:
        """Raises ValueError for ``max_new_tokens`` < 1, a ``temperature`` that is not a finite
        number >= 0, ``top_p`` outside (0, 1] or ``top_k`` < -1 (the CLI's
        ``actor_rollout_ref.rollout.*`` range checks, for callers of the Python API)."""
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if not (0 < self.top_p <= 1):  # also refuses NaN
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be -1 (off), 0 (off) or >= 1, got {self.top_k}")

    @property
    def greedy(self) -> bool:
        return (not self.do_sample) or self.temperature <= 0.0


class Rollout(ABC):
    """A generation backend (``actor_rollout_ref.rollout.name``)."""

    @abstractmethod
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        """Sample one response per row of ``prompts``; see the module docstring for shapes."""

    def metrics(self) -> dict[str, float]:
        """``rollout/*`` metrics of the last :meth:`generate` call (none by default)."""
        return {}

    @property
    def collective(self) -> bool:
        """True when :meth:`generate` is a collective over a group of ranks (a tensor-parallel
        rollout): every rank must call it, also with no rows of its own.  False by default."""
        return False

    def weight_slices(self) -> dict[str, Any]:
        """``{state-dict name in the generating module: its Slice}`` for each tensor of which this
        rank holds only a part (:mod:`rlforge.rollout.native.tensor_parallel`); the weight sync
        copies each such tensor's slice only.  Empty by default (every tensor whole)."""
        return {}

    @classmethod
    def from_config(
        cls, module: torch.nn.Module, eos_ids: list[int], pad_id: int, device: torch.device,
        autocast_dtype: torch.dtype | None, rollout_cfg: object,
    ) -> Rollout:
        """Build the backend from ``actor_rollout_ref.rollout`` config; backends with their own
        settings override this."""
        return cls(module, eos_ids, pad_id, device, autocast_dtype=autocast_dtype)  # type: ignore[call-arg]


ROLLOUTS: Registry[type[Rollout]] = Registry("rollout backend", "actor_rollout_ref.rollout.name")


def response_mask_from_eos(responses: torch.Tensor, eos_ids: list[int]) -> torch.Tensor:
    """``(batch, response_len)`` int64 mask: 1 up to and including the first EOS token.

    A response without EOS is all ones (it ran into ``max_response_length``).
    """
    is_eos = torch.zeros_like(responses, dtype=torch.bool)
    for e in eos_ids:
        is_eos |= responses == e
    # number of EOS tokens strictly before each position
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()
    return (eos_before == 0).long()


def assemble(prompts: Batch, responses: torch.Tensor, eos_ids: list[int], pad_id: int) -> Batch:
    """Build the rollout output batch from left-padded prompts and raw responses."""
    mask = response_mask_from_eos(responses, eos_ids)
    responses = torch.where(mask.bool(), responses, torch.full_like(responses, pad_id))
    p_ids, p_mask = prompts["input_ids"], prompts["attention_mask"].long()
    attn = torch.cat([p_mask, mask], dim=1)
    pos = (torch.cumsum(attn, dim=1) - 1).clamp(min=0)
    return Batch.from_dict(
        {
            "prompts": p_ids,
            "responses": responses,
            "response_mask": mask,
            "input_ids": torch.cat([p_ids, responses], dim=1),
            "attention_mask": attn,
            "position_ids": pos,
        },
        {k: v for k, v in prompts.non_tensor.items()},
        dict(prompts.meta),
    )

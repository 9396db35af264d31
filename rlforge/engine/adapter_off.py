"""The reference policy of a LoRA run: the actor's engine with the adapter switched off.

With ``model.lora_rank > 0`` the reference is the base model, which the actor's module
already holds (the adapter only adds ``scaling * B @ A``).  :class:`AdapterOffEngine` runs
the actor engine's forward-only ``infer`` inside :func:`rlforge.models.lora.adapter_disabled`,
so no second copy of the weights exists (verl does the same when LoRA is on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.engine.base import ForwardFn, LossFn, TrainEngine


class AdapterOffEngine(TrainEngine):
    """Forward-only view of ``engine`` with every LoRA adapter of its module disabled.

    Args:
        engine: the actor's engine (its module holds peft LoRA layers).
    """

    optimizer = None
    scheduler = None

    def __init__(self, engine: TrainEngine) -> None:
        self.engine = engine
        self.module = engine.module
        self.device = engine.device
        self.head_readable_after_forward = engine.head_readable_after_forward
        self.packed_forward = engine.packed_forward
        self.share_prompts = engine.share_prompts

    @torch.no_grad()
    def infer(self, batch: Batch, forward_fn: ForwardFn, micro_batch_size: int,
              max_token_len: int | None = None) -> dict[str, torch.Tensor]:
        """The wrapped engine's ``infer`` with the adapter off: the base model's outputs,
        ``(batch, ...)`` float32 on CPU in ``batch``'s row order."""
        from rlforge.models.lora import adapter_disabled

        with adapter_disabled(self.engine.module):
            return self.engine.infer(batch, forward_fn, micro_batch_size, max_token_len)

    def train_step(self, mini_batch: Batch, loss_fn: LossFn, micro_batch_size: int,
                   max_token_len: int | None = None) -> dict[str, float]:
        raise RuntimeError("the LoRA reference is forward-only (the actor's base model with the adapter off)")

    def full_params_iter(self, device: torch.device | str | None = None,
                         keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        raise NotImplementedError("the LoRA reference has no weights of its own; gather the actor engine's")

    def sync_to(self, target: torch.nn.Module) -> None:
        raise NotImplementedError("the LoRA reference has no weights of its own; sync from the actor engine")

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        return None

"""The single-process reference engine of the tests: one CPU or one GPU, a plain ``torch.nn.Module``.

No config builds it (``rlforge train`` always builds the strategy's sharded engine, on a one-device
mesh in one process); the tests use it as the unsharded reference that the FSDP and Megatron engines
must match, and as a light :class:`~rlforge.engine.base.TrainEngine` for role-level tests.

Parameters stay float32 (the master copy); with ``autocast_dtype`` the forward runs under
``torch.autocast``.  Gradients accumulate over micro-batches; the loss functions scale each
micro-batch's loss by the mini-batch totals (:class:`LossScale`), so the gradient does not depend on
the micro-batch split.  A step whose gradient norm is not finite is skipped, as in verl, and reported
through ``grad_norm``.  Its state dict has the same keys and optimizer format as the sharded engines'.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch

from rlforge.algorithms import loss_agg_globals
from rlforge.batch import Batch
from rlforge.engine.base import (
    SAVED_S2,
    SAVED_TOKENS,
    ForwardFn,
    LossFn,
    LossScale,
    TrainEngine,
    copy_full_params,
    micro_batches,
)
from rlforge.engine.staging import combine_micro_metrics, saved_work, stage


class LocalEngine(TrainEngine):
    """Args:
        module: the model (moved to ``device``).
        device: ``cpu`` or ``cuda:N``.
        optimizer, scheduler: None for a forward-only model (the reference policy).
        grad_clip: max global gradient norm (``<= 0`` disables clipping).
        autocast_dtype: mixed-precision dtype for the forward (None = full float32).
        share_prompts: see :attr:`~rlforge.engine.base.TrainEngine.share_prompts`.
    """

    head_readable_after_forward = True

    def __init__(
        self,
        module: torch.nn.Module,
        device: torch.device,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        grad_clip: float = 1.0,
        autocast_dtype: torch.dtype | None = None,
        share_prompts: bool = False,
    ) -> None:
        self.module = module.to(device)
        self.device = device
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.grad_clip = grad_clip
        self.autocast_dtype = autocast_dtype
        self.share_prompts = share_prompts

    def autocast(self) -> AbstractContextManager:
        """The mixed-precision context for forwards."""
        return torch.autocast(
            self.device.type, dtype=self.autocast_dtype or torch.float32, enabled=self.autocast_dtype is not None
        )

    @torch.no_grad()
    def infer(
        self, batch: Batch, forward_fn: ForwardFn, micro_batch_size: int, max_token_len: int | None = None
    ) -> dict[str, torch.Tensor]:
        was_training = self.module.training
        self.module.eval()
        outs: dict[str, list[torch.Tensor]] = defaultdict(list)
        parts, restore = micro_batches(batch, micro_batch_size, max_token_len, "log_prob_max_token_len_per_gpu",
                                       share_prompts=self.share_prompts)
        try:
            for mb in stage(parts, self.device, self.share_prompts):
                with self.autocast():
                    res = forward_fn(self.module, mb)
                for k, v in res.items():
                    outs[k].append(v.float())
        finally:
            self.module.train(was_training)
        cat = {k: torch.cat(v, 0).cpu() for k, v in outs.items()}
        return cat if restore is None else {k: v[restore] for k, v in cat.items()}

    def train_step(
        self, mini_batch: Batch, loss_fn: LossFn, micro_batch_size: int, max_token_len: int | None = None
    ) -> dict[str, float]:
        if self.optimizer is None:
            raise RuntimeError("this engine has no optimizer (forward-only model)")
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        scale = LossScale(**loss_agg_globals(mini_batch["response_mask"].float()))
        per_micro: list[dict[str, Any]] = []
        parts, _ = micro_batches(mini_batch, micro_batch_size, max_token_len, "ppo_max_token_len_per_gpu",
                                 share_prompts=self.share_prompts)
        staged = stage(parts, self.device, self.share_prompts)
        for mb in staged:
            with self.autocast():
                loss, metrics = loss_fn(self.module, mb, scale)
            loss.backward()
            per_micro.append(metrics)
        params = [p for p in self.module.parameters() if p.requires_grad]
        max_norm = self.grad_clip if self.grad_clip and self.grad_clip > 0 else math.inf
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        out = combine_micro_metrics(per_micro)
        out["grad_norm"] = grad_norm
        if self.share_prompts:
            out[SAVED_TOKENS], out[SAVED_S2] = (float(x) for x in saved_work(staged))
        return out

    def full_params_iter(self, device: torch.device | str | None = None,
                         keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        dest = torch.device(device) if device is not None else self.device
        for name, t in self.module.state_dict().items():
            if keep is None or keep(name):
                yield name, t.detach().to(dest)

    @torch.no_grad()
    def sync_to(self, target: torch.nn.Module) -> None:
        copy_full_params(self.full_params_iter(), target)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["model"])
        if self.optimizer is not None and state.get("optimizer") is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])

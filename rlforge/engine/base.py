"""The training-engine interface.

An engine owns one model's parameters, their optimizer and LR schedule, the device and
the numeric precision.  Roles (actor, critic, reference) hand it a batch and a loss or
forward function; the engine decides how that runs: micro-batching, gradient
accumulation, mixed precision, gradient clipping and, in later engines, FSDP2 sharding,
tensor/pipeline parallelism and offload.  The trainer never branches on the engine type.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.registry import Registry


@dataclass(frozen=True)
class LossScale:
    """Mini-batch totals passed to each micro-batch's loss so that the micro-batch losses
    sum to the mini-batch loss exactly, whatever the split (see ``algorithms.agg_loss``).

    ``global_num_tokens``: valid response tokens in the mini-batch;
    ``global_num_seqs``: sequences in the mini-batch.
    ``dp_size``: ranks whose gradients are averaged (``loss_agg_mode=token-sum`` scales its sum by it).
    """

    global_num_tokens: float
    global_num_seqs: float
    dp_size: int = 1


# loss_fn(module, micro_batch, scale) -> (loss to backpropagate, metrics of this micro-batch)
LossFn = Callable[[torch.nn.Module, Batch, LossScale], tuple[torch.Tensor, dict[str, float]]]
# forward_fn(module, micro_batch) -> dict of (micro_batch, ...) tensors
ForwardFn = Callable[[torch.nn.Module, Batch], dict[str, torch.Tensor]]


class TrainEngine(ABC):
    """One model with its optimizer; see the module docstring."""

    module: torch.nn.Module
    device: torch.device
    optimizer: torch.optim.Optimizer | None
    scheduler: torch.optim.lr_scheduler.LRScheduler | None
    head_readable_after_forward: bool = False
    """Whether the LM head's full weight can be used after ``module``'s forward returned, inside
    the same autograd graph (the chunked LM-head log-probs of :mod:`rlforge.roles.fused_head`
    need it).  False where a wrapper re-shards it (FSDP1) or splits it (tensor parallelism)."""
    share_prompts: bool = False
    """Whether micro-batches run each prompt once for the rows that share it
    (``actor.use_prefix_grouper``; a constructor argument of the engines that support it):
    token-budget splits keep a prompt's rows together and the packing plans use the
    shared-prompt layout.  :meth:`train_step` then reports the work it saved under
    :data:`SAVED_TOKENS` and :data:`SAVED_S2`."""
    packed_forward: bool = True
    """Whether forward and loss functions may call ``module`` on packed, padding-free rows
    (``model.use_remove_padding``).  False where the engine runs the model itself and hands the
    functions its outputs for the padded micro-batch (``strategy=megatron``)."""

    @abstractmethod
    def infer(
        self, batch: Batch, forward_fn: ForwardFn, micro_batch_size: int, max_token_len: int | None = None
    ) -> dict[str, torch.Tensor]:
        """Run ``forward_fn`` without gradients over micro-batches; concatenate the outputs on
        CPU in the original row order.  ``max_token_len`` (dynamic batching) forms the
        micro-batches by token budget instead of ``micro_batch_size`` rows."""

    @abstractmethod
    def train_step(
        self, mini_batch: Batch, loss_fn: LossFn, micro_batch_size: int, max_token_len: int | None = None
    ) -> dict[str, float]:
        """One optimizer step on ``mini_batch`` with gradient accumulation over micro-batches
        (``micro_batch_size`` rows each, or a token budget of ``max_token_len``).

        Returns the micro-batch metrics (loss shares summed, others averaged) plus
        ``grad_norm``; with :attr:`share_prompts` also :data:`SAVED_TOKENS` and
        :data:`SAVED_S2`: the ``(tokens, Σ s²)`` the shared-prompt layout did not compute in this
        step, summed over all ranks (:func:`rlforge.engine.staging.saved_work`; the caller takes
        them out of the metrics, see :func:`pop_saved_work`).
        """

    @abstractmethod
    def full_params_iter(self, device: torch.device | str | None = None,
                         keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor)`` for every entry of the plain (unsharded) module's state dict,
        gathered one tensor at a time (a collective where the engine is sharded: all ranks iterate
        together).  ``device``: where the tensors go (default: the engine's device); ``keep``: a
        name filter, the same on every rank (None = all).

        Raises:
            NotImplementedError: an engine without weights of its own (a forward-only view).
        """

    @abstractmethod
    def sync_to(self, target: torch.nn.Module) -> None:
        """Copy the full weights into the plain module ``target`` (the rollout's copy of the policy),
        tensor by tensor, in place (:func:`copy_full_params`; a collective where sharded).

        Raises:
            NotImplementedError: an engine without weights of its own (a forward-only view).
        """

    def phase(self) -> AbstractContextManager:
        """Context around one phase of work on this engine's weights (an update of several optimizer
        steps, a log-prob pass, a weight sync): with ``fsdp_config.param_offload`` the parameters are
        on the device inside it and on the CPU after the outermost one ends
        (:mod:`rlforge.engine.param_offload`).  Reentrant; the engines' own calls enter it too.
        A no-op by default."""
        return nullcontext()

    def lr_scheduler_step(self) -> float:
        """Advance the LR schedule by one RL step; return the new learning rate."""
        if self.scheduler is not None:
            self.scheduler.step()
        return self.lr

    def metrics(self) -> dict[str, float]:
        """Engine-level metrics of the steps since the last call (e.g. ``parallel/*`` placement);
        empty by default."""
        return {}

    @property
    def lr(self) -> float:
        """The current learning rate of the first parameter group (0 without an optimizer)."""
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer is not None else 0.0

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: ``model``, ``optimizer``, ``scheduler`` states."""

    @abstractmethod
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s output."""

    @contextmanager
    def sharded_state(self) -> Iterator[dict[str, Any] | None]:
        """This rank's shards for ``torch.distributed.checkpoint`` (DCP): ``{"model", "optimizer",
        "scheduler"}`` with DTensor / ShardedTensor values, valid inside the context (a collective: every
        rank enters it).  None (the default) when the engine has no sharded state: the checkpoint then
        holds :meth:`state_dict`'s full state (:mod:`rlforge.trainer.checkpointer`)."""
        yield None

    def load_sharded_state(self, read: Callable[[dict[str, Any]], None]) -> None:
        """Restore a DCP checkpoint: ``read(template)`` fills :meth:`sharded_state`'s template in place
        (``dcp.load``, which reshards), then the engine takes it.

        Raises:
            ValueError: the engine has no sharded state (the message names the strategy)."""
        raise ValueError(f"strategy {getattr(self, 'strategy', type(self).__name__)!r} loads only full-state checkpoints (actor/state.pt), "
                         "not sharded (DCP) ones")


@torch.no_grad()
def copy_full_params(params: Iterable[tuple[str, torch.Tensor]], target: torch.nn.Module) -> None:
    """Copy ``(name, full tensor)`` pairs into the plain module ``target``'s state, in place,
    one tensor at a time (names ``target`` lacks are skipped).  Used by the sharded engines'
    ``sync_to`` to refresh the rollout's copy of the weights."""
    dest = target.state_dict()
    for name, t in params:
        if name in dest:
            dest[name].copy_(t)


def micro_batches(batch: Batch, micro_batch_size: int, max_token_len: int | None, key: str,
                  group: object = None, share_prompts: bool = False) -> tuple[list[Batch], torch.Tensor | None]:
    """The micro-batches of ``batch`` and, for token-budget batches, the permutation that
    restores the original order of concatenated outputs (None when the order is kept).
    ``share_prompts``: see :attr:`TrainEngine.share_prompts`."""
    if max_token_len is None:
        return batch.split(micro_batch_size), None
    from rlforge.engine.dynamic_batch import restore_order, split_by_token_budget

    parts, order = split_by_token_budget(batch, max_token_len, key, group, share_prompts)
    return parts, restore_order(order)


SAVED_TOKENS = "prefix_grouper/saved_tokens"
"""Key of :meth:`TrainEngine.train_step`'s result: prompt tokens not computed (shared prompts)."""
SAVED_S2 = "prefix_grouper/saved_s2"
"""Key of :meth:`TrainEngine.train_step`'s result: Σ s² of the attention work not computed."""


def pop_saved_work(metrics: dict[str, float]) -> tuple[float, float]:
    """Remove :data:`SAVED_TOKENS` and :data:`SAVED_S2` from one :meth:`TrainEngine.train_step`
    result; return them as ``(tokens, Σ s²)`` (``(0, 0)`` where absent)."""
    return float(metrics.pop(SAVED_TOKENS, 0.0)), float(metrics.pop(SAVED_S2, 0.0))


ENGINES: Registry[type[TrainEngine]] = Registry("training engine", "actor_rollout_ref.actor.strategy")

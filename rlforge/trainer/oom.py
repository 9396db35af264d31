"""CUDA out-of-memory in a trainer stage: one message naming the stage, the memory and the keys to change.

:func:`oom_guard` wraps each stage of :class:`~rlforge.trainer.ppo_trainer.PPOTrainer` (inside its
``timed`` block).  A ``torch.OutOfMemoryError``, or a ``RuntimeError`` whose text says "out of memory"
(``CUDA error: out of memory`` from the driver, cuBLAS or NCCL), becomes a
:class:`~rlforge.errors.DeviceOutOfMemory`: the CLI prints its one message and exits with status 2,
no traceback.  The original error stays chained (``__cause__``) for a caller that wants it.  Any other
exception passes through unchanged.

The message names the stage, the GiB PyTorch had allocated and reserved at the time and the device's
total, and the config keys that lower that stage's memory, from :data:`STAGE_KEYS` (one table):
offload keys for the role's strategy (``fsdp_config.*`` for fsdp/fsdp2, ``megatron.*`` for megatron),
the stage's token budget (``*_max_token_len_per_gpu`` with dynamic batching, else the micro-batch
size), activation checkpointing for updates, the chunked LM head for the actor's stages, and the
rollout's memory keys for generation.  A boolean key already on is left out; a size is shown with
its current value.  For an engine without parameter or optimizer offload (``offload_works=False``)
the offload keys are named as needing a sharded engine.

Online back-off (:mod:`rlforge.trainer.backoff`) comes first: where the tuner owns the stage's budget
or checkpointing, the stage lowers it and redoes its work, and only an error it cannot answer reaches
:func:`oom_guard`; its ``note`` then says why (a key the user set, nothing left to lower).

Before the error is raised, the memory the failed stage still holds through the traceback's finished
frames (activations, logits) is released and PyTorch's cache is returned to the driver, so a caller
that catches the error (a sweep in one process) gets the memory back; the numbers in the message are
read first, at the moment of the error.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from rlforge.config.common import get_key
from rlforge.config.rollout import VERL_ROLLOUTS
from rlforge.errors import DeviceOutOfMemory

GiB = float(2**30)


@dataclass(frozen=True)
class Knob:
    """One config key that lowers a stage's memory.

    Attributes:
        key: dotted config key.
        lower: True: a size to lower (shown with its value); False: a boolean to switch on
            (left out when it is already on).
        when: ``(dotted key, values)``: the knob applies only when that key has one of the values
            (the role's strategy, whether dynamic batching is on, the rollout backend).
    """

    key: str
    lower: bool = False
    when: tuple[str, tuple[Any, ...]] | None = None
    offload: bool = False
    """A parameter/optimizer offload key (no effect in the local engine)."""


_ARR = "actor_rollout_ref"
_FSDP = ("fsdp", "fsdp2")


def _offload(strategy_key: str, fsdp_node: str, megatron_node: str, params: bool = True) -> tuple[Knob, ...]:
    """Parameter (``params``) and optimizer offload of one role, for its strategy."""
    names = ("param_offload", "optimizer_offload") if params else ("optimizer_offload",)
    return (*(Knob(f"{fsdp_node}.fsdp_config.{n}", when=(strategy_key, _FSDP), offload=True) for n in names),
            *(Knob(f"{megatron_node}.megatron.{n}", when=(strategy_key, ("megatron",)), offload=True) for n in names))


def _budget(dynamic_key: str, tokens_key: str, micro_key: str) -> tuple[Knob, ...]:
    """The token budget with dynamic batching, else the micro-batch size."""
    return (Knob(tokens_key, lower=True, when=(dynamic_key, (True,))),
            Knob(micro_key, lower=True, when=(dynamic_key, (False,))))


_A, _R, _RO = f"{_ARR}.actor", f"{_ARR}.ref", f"{_ARR}.rollout"
_ACTOR_OFFLOAD = _offload(f"{_A}.strategy", _A, _A)
_CHUNKED_HEAD = Knob(f"{_ARR}.model.use_fused_kernels")
_GEN = (
    Knob(f"{_RO}.gpu_memory_utilization", lower=True, when=(f"{_RO}.name", ("native", *VERL_ROLLOUTS))),
    Knob(f"{_RO}.max_num_seqs", lower=True, when=(f"{_RO}.name", ("native", *VERL_ROLLOUTS))),
    Knob(f"{_RO}.max_num_batched_tokens", lower=True, when=(f"{_RO}.name", ("native", *VERL_ROLLOUTS))),
    *_offload(f"{_A}.strategy", _A, _A, params=False),  # the AdamW moments leave the GPU between updates
)

STAGE_KEYS: dict[str, tuple[Knob, ...]] = {
    "gen": (*_GEN, Knob("data.train_batch_size", lower=True, when=(f"{_RO}.name", ("hf",)))),
    "gen_max": (*_GEN, Knob("data.train_batch_size", lower=True, when=(f"{_RO}.name", ("hf",)))),
    "testing": (*_GEN, Knob("data.val_batch_size", lower=True)),
    "old_log_prob": (*_budget(f"{_RO}.log_prob_use_dynamic_bsz", f"{_RO}.log_prob_max_token_len_per_gpu",
                              f"{_RO}.log_prob_micro_batch_size_per_gpu"), _CHUNKED_HEAD, *_ACTOR_OFFLOAD),
    "ref": (*_budget(f"{_R}.log_prob_use_dynamic_bsz", f"{_R}.log_prob_max_token_len_per_gpu",
                     f"{_R}.log_prob_micro_batch_size_per_gpu"), _CHUNKED_HEAD,
            Knob(f"{_R}.fsdp_config.param_offload", when=(f"{_R}.strategy", _FSDP), offload=True),
            Knob(f"{_R}.megatron.param_offload", when=(f"{_R}.strategy", ("megatron",)), offload=True)),
    "values": (*_budget("critic.use_dynamic_bsz", "critic.forward_max_token_len_per_gpu",
                        "critic.forward_micro_batch_size_per_gpu"),
               *_offload("critic.strategy", "critic.model", "critic")),
    "update_critic": (*_budget("critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu",
                               "critic.ppo_micro_batch_size_per_gpu"),
                      Knob("critic.model.enable_gradient_checkpointing"),
                      *_offload("critic.strategy", "critic.model", "critic")),
    "update_actor": (*_budget(f"{_A}.use_dynamic_bsz", f"{_A}.ppo_max_token_len_per_gpu",
                              f"{_A}.ppo_micro_batch_size_per_gpu"),
                     Knob(f"{_ARR}.model.enable_gradient_checkpointing"), _CHUNKED_HEAD, *_ACTOR_OFFLOAD),
}
"""Stage (``timing_s/<stage>``) -> the keys that lower its memory.  A stage not listed (``reward``,
``adv``, ``step``) gets :data:`OTHER_KEYS`."""

OTHER_KEYS: tuple[Knob, ...] = _ACTOR_OFFLOAD


@dataclass(frozen=True)
class MemoryReading:
    """CUDA memory at the time of the error, bytes: PyTorch's ``memory_allocated`` and
    ``memory_reserved`` and the device's ``total_memory``."""

    allocated: int
    reserved: int
    total: int
    device: str


def cuda_memory() -> MemoryReading | None:
    """The current CUDA device's memory, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    dev = torch.cuda.current_device()
    return MemoryReading(torch.cuda.memory_allocated(dev), torch.cuda.memory_reserved(dev),
                         torch.cuda.get_device_properties(dev).total_memory, f"cuda:{dev}")


def is_oom(e: BaseException) -> bool:
    """A CUDA (or other accelerator) out-of-memory error: ``torch.OutOfMemoryError``, or a
    ``RuntimeError`` whose text says "out of memory"."""
    return isinstance(e, torch.OutOfMemoryError) or (isinstance(e, RuntimeError) and "out of memory" in str(e).lower())


def _advice(cfg: Any, stage: str, offload_works: bool) -> tuple[list[str], list[str]]:
    """(suggestions that apply, offload keys that would need a sharded engine)."""
    tips: list[str] = []
    needs_procs: list[str] = []
    for knob in STAGE_KEYS.get(stage, OTHER_KEYS):
        if knob.when is not None and get_key(cfg, knob.when[0]) not in knob.when[1]:
            continue
        value = get_key(cfg, knob.key)
        if knob.lower:
            shown = "null (the whole batch)" if value is None else value
            tips.append(f"lower {knob.key} (now {shown})")
        elif value is not True:
            if knob.offload and not offload_works:
                needs_procs.append(knob.key)
            else:
                tips.append(f"set {knob.key}=true")
    return tips, needs_procs


def oom_message(stage: str, cfg: Any, error: BaseException, memory: MemoryReading | None,
                offload_works: bool = True, note: str = "") -> str:
    """The one-line message for ``error`` in ``stage`` (see the module docstring); ``note`` (why
    online back-off did not save the stage, :mod:`rlforge.trainer.backoff`) is added where given."""
    found = re.search(r"tried to allocate ([\d.]+ [KMGT]?i?B)", str(error), re.IGNORECASE)
    asked = f"tried to allocate {found.group(1)}; " if found else ""
    if memory is None:
        where = f"{asked}no CUDA memory reading"
    else:
        where = (f"{asked}{memory.allocated / GiB:.1f} GiB allocated and {memory.reserved / GiB:.1f} GiB reserved "
                 f"by PyTorch of {memory.total / GiB:.1f} GiB on {memory.device}")
    tips, needs_procs = _advice(cfg, stage, offload_works)
    msg = f"out of memory in stage {stage} ({where})"
    if note:
        msg += f"; {note}"
    msg += f". To lower this stage's memory: {'; '.join(tips) or '-'}"
    if needs_procs:
        msg += (f". {', '.join(k + '=true' for k in needs_procs)} would also help but take effect only in a sharded "
                "engine (strategy fsdp, fsdp2 or megatron); this run's local engine keeps everything on the device")
    if memory is not None and memory.reserved - memory.allocated >= max(GiB, 0.1 * memory.total):
        msg += (f". {(memory.reserved - memory.allocated) / GiB:.1f} GiB are reserved but not allocated "
                "(fragmentation): PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True may help")
    return msg


def release_memory(e: BaseException) -> None:
    """Drop the locals of the finished frames of ``e``'s traceback (activations, logits) and
    return PyTorch's cached blocks to the driver.  The frames still running are left alone."""
    traceback.clear_frames(e.__traceback__)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextmanager
def oom_guard(stage: str, cfg: Any, offload_works: bool = True,
              read_memory: Callable[[], MemoryReading | None] = cuda_memory,
              note: Callable[[str], str] | None = None) -> Iterator[None]:
    """Turn an out-of-memory error raised inside the block into a :class:`DeviceOutOfMemory`
    naming ``stage`` and the keys of ``cfg`` to change; any other exception passes unchanged.

    Args:
        stage: the stage name (``timing_s/<stage>``), a key of :data:`STAGE_KEYS`.
        cfg: the run's config.
        offload_works: whether the run's engines offload (False for the local engine: the
            offload keys are then named as needing a sharded engine).
        read_memory: the memory reading (:func:`cuda_memory`; a fake in tests).
        note: ``note(stage)``: a clause added to the message (why online back-off did not save
            the stage: :meth:`rlforge.trainer.backoff.Backoffs.note`); None: none.
    """
    try:
        yield
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if not is_oom(e):
            raise
        memory = read_memory()  # before anything is freed
        message = oom_message(stage, cfg, e, memory, offload_works, note(stage) if note is not None else "")
        release_memory(e)
        raise DeviceOutOfMemory(message) from e

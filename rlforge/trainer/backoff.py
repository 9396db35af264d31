"""Online back-off (issue 39, item 6): a stage that runs out of memory lowers its micro-batching and
redoes its work instead of stopping the run.

The tuner picks the token budgets and checkpointing from a memory model and short probes; a batch
longer than the probes saw can still run out of memory.  Then, in the stages that split their batch
into micro-batches (``old_log_prob``, ``ref``, ``values``, ``update_critic``, ``update_actor``):

1. the stage's micro-batch budget is halved: the token budget (``*_max_token_len_per_gpu``) with
   dynamic batching, never below ``data.max_prompt_length + data.max_response_length`` (the longest
   possible row, as the config check requires); else the micro-batch size, never below one row;
2. when it cannot shrink further, an update stage turns on activation checkpointing (the model's
   ``enable_gradient_checkpointing``);
3. the failed work is redone.  A forward-only stage redoes its whole forward (it changes no state).
   An update redoes only the optimizer step (mini-batch) that failed: the engines zero the gradients
   at the start of ``train_step`` and step the optimizer after the last micro-batch, so the earlier
   steps stand and the redone one computes the same update as a run that used the smaller budget
   from the start (up to float summation order).  The RNG state is put back before the redo; the
   LR schedule, the KL controller and the data loader only move outside the stages.  An error
   raised after the optimizer began its step (seen through a step pre-hook) is never redone.

Which keys it may change: only those the tuner owns, i.e. that the user did not set
(:func:`rlforge.tune.unset.is_users`, which follows interpolations: ``ref.log_prob_max_token_len_per_gpu``
follows a user's ``actor.ppo_max_token_len_per_gpu``).  A micro-batch size counts as the user's
when the user set it or a key it falls back to (``rollout.log_prob_micro_batch_size_per_gpu`` falls
back to the actor's).  A value the user chose is never changed behind their back: an out-of-memory
error then ends the run with :mod:`rlforge.trainer.oom`'s one-line message, which says that back-off
left the key alone.  Checkpointing is a lever of its own: with a user-set budget and checkpointing
left to the tuner, back-off turns checkpointing on.

Every change is one line on stderr (``rlforge: out of memory in stage S: KEY A -> B; redoing ...``),
is written into the config object (so later messages and ``perf/mfu`` see the current values) and
counted: :meth:`Backoffs.metrics` gives ``tune/oom_backoffs`` (changes since the run started) and
the current value of every key back-off may change (``tune/actor/ppo_max_token_len_per_gpu``, ...).

Only single-process runs back off: with several ranks the other ranks wait in a collective for the
one that failed, so an error there still ends the run.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.config.common import get_key
from rlforge.engine.activation import switch_checkpointing
from rlforge.roles.common import MicroBudget
from rlforge.trainer.oom import STAGE_KEYS, is_oom, release_memory
from rlforge.tune.apply import set_key
from rlforge.tune.unset import is_users

_ARR = "actor_rollout_ref"
_A, _RO, _R = f"{_ARR}.actor", f"{_ARR}.rollout", f"{_ARR}.ref"
_ACTOR_MICRO = (f"{_A}.ppo_micro_batch_size_per_gpu", f"{_A}.ppo_micro_batch_size")
_CRITIC_MICRO = ("critic.ppo_micro_batch_size_per_gpu", "critic.ppo_micro_batch_size")

FALLBACKS: dict[str, tuple[str, ...]] = {
    _ACTOR_MICRO[0]: _ACTOR_MICRO[1:],
    f"{_RO}.log_prob_micro_batch_size_per_gpu": (f"{_RO}.log_prob_micro_batch_size", *_ACTOR_MICRO),
    f"{_R}.log_prob_micro_batch_size_per_gpu": (f"{_R}.log_prob_micro_batch_size", *_ACTOR_MICRO),
    _CRITIC_MICRO[0]: _CRITIC_MICRO[1:],
    "critic.forward_micro_batch_size_per_gpu": ("critic.forward_micro_batch_size", *_CRITIC_MICRO),
}
"""A micro-batch size key -> the keys its value falls back to when unset
(:func:`rlforge.trainer.builders.sizes.per_step_sizes`)."""

BACKOFF_STAGES = ("old_log_prob", "ref", "values", "update_critic", "update_actor")
"""The stages that back off (those that split their batch into micro-batches)."""


def budget_key(cfg: Any, stage: str) -> str:
    """The key of ``stage``'s micro-batch budget in ``cfg``: the first size in
    :data:`rlforge.trainer.oom.STAGE_KEYS` whose condition holds (the token budget with dynamic
    batching, else the micro-batch size)."""
    for knob in STAGE_KEYS[stage]:
        if knob.lower and (knob.when is None or get_key(cfg, knob.when[0]) in knob.when[1]):
            return knob.key
    raise KeyError(stage)  # pragma: no cover - every stage of BACKOFF_STAGES has one


def checkpoint_key(stage: str) -> str | None:
    """The checkpointing key that lowers ``stage``'s memory (update stages), or None."""
    return next((k.key for k in STAGE_KEYS[stage] if k.key.endswith(".enable_gradient_checkpointing")), None)


def tuner_owns(cfg: Any, key: str) -> bool:
    """Whether back-off may change ``key``: the user set neither it, the key its default
    interpolates, nor (micro-batch sizes) a key it falls back to."""
    return not any(is_users(cfg, k) for k in (key, *FALLBACKS.get(key, ())))


def may_switch_checkpointing(cfg: Any, key: str, world_size: int) -> bool:
    """Whether an engine should be built with switchable checkpointing (see
    :func:`rlforge.trainer.builders.engines.make_engine`): a single-process run, checkpointing off
    and left to the tuner."""
    return world_size == 1 and not bool(get_key(cfg, key)) and tuner_owns(cfg, key)


def metric_name(key: str) -> str:
    """``tune/<key>`` without ``actor_rollout_ref.``, dots as slashes (``tune/actor/ppo_max_token_len_per_gpu``)."""
    short = key[len(_ARR) + 1:] if key.startswith(_ARR + ".") else key
    return "tune/" + short.replace(".", "/")


@dataclass(frozen=True)
class Change:
    """One back-off: in ``stage``, ``key`` went from ``before`` to ``after``."""

    stage: str
    key: str
    before: Any
    after: Any

    def line(self) -> str:
        return (f"rlforge: out of memory in stage {self.stage}: {self.key} {self.before} -> {self.after}; "
                "redoing the stage's work")


class Backoffs:
    """The run's back-off: the watched stages, the changes made, and what to say when it gives up.

    Args:
        cfg: the run's config (changed keys are written into it).
        out: where each change's line goes (stderr by default).
    """

    def __init__(self, cfg: Any, out: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.out = out or (lambda line: print(line, file=sys.stderr, flush=True))
        self.changes: list[Change] = []
        self.values: dict[str, Callable[[], float]] = {}
        """Key back-off may change -> its current value (in :meth:`metrics`)."""
        self.notes: dict[str, str] = {}
        """Stage -> why its last out-of-memory error was not backed off (for the final message)."""
        self.single_process = True

    def record(self, change: Change) -> None:
        set_key(self.cfg, change.key, change.after)
        self.changes.append(change)
        self.out(change.line())

    def metrics(self) -> dict[str, float]:
        """``tune/oom_backoffs`` and the current value of each key back-off may change."""
        m = {"tune/oom_backoffs": float(len(self.changes))}
        m.update({metric_name(k): value() for k, value in sorted(self.values.items())})
        return m

    def note(self, stage: str) -> str:
        """Why back-off did not save ``stage`` (empty for stages it does not watch)."""
        if not self.single_process and stage in BACKOFF_STAGES:
            return "online back-off is off with several processes (the other ranks wait in a collective)"
        return self.notes.get(stage, "")


class StageBackoff:
    """The :class:`~rlforge.roles.common.Redo` of one stage (see the module docstring).

    Args:
        log: the run's :class:`Backoffs`.
        stage: the stage name (``timing_s/<stage>``).
        engine: the stage's engine (its optimizer's steps are watched; its module's checkpointing
            may be switched on).
        budget_key: the key of the stage's budget (:func:`budget_key`); ``floor``: its lowest value.
        ckpt_key: the checkpointing key of an update stage, else None.
    """

    def __init__(self, log: Backoffs, stage: str, engine: Any, budget_key: str, floor: int,
                 ckpt_key: str | None) -> None:
        self.log, self.stage, self.engine = log, stage, engine
        self.budget_key, self.floor, self.ckpt_key = budget_key, floor, ckpt_key
        self.budget_free = tuner_owns(log.cfg, budget_key)
        self.ckpt_free = ckpt_key is not None and tuner_owns(log.cfg, ckpt_key)
        self.optimizer_steps = 0
        optimizer = getattr(engine, "optimizer", None)
        self.watched = optimizer is None or hasattr(optimizer, "register_step_pre_hook")
        """Whether a step that began can be seen (else an update is never redone)."""
        if optimizer is not None and self.watched:
            optimizer.register_step_pre_hook(self._count_step)

    def _count_step(self, *_: Any) -> None:
        self.optimizer_steps += 1

    def snapshot(self) -> tuple[int, torch.Tensor, torch.Tensor | None]:
        cuda = torch.cuda.get_rng_state(self.engine.device) if self.engine.device.type == "cuda" else None
        return self.optimizer_steps, torch.get_rng_state(), cuda

    def should_redo(self, budget: MicroBudget, batch: Batch, error: Exception,
                    snapshot: tuple[int, torch.Tensor, torch.Tensor | None]) -> bool:
        if not is_oom(error):
            return False
        if snapshot[0] != self.optimizer_steps or not self.watched:
            self.log.notes[self.stage] = "online back-off cannot redo an optimizer step that had begun"
            return False
        change = self._lower(budget, batch)
        if change is None:
            return False
        release_memory(error)
        if getattr(self.engine, "optimizer", None) is not None:
            self.engine.optimizer.zero_grad(set_to_none=True)  # the failed attempt's partial gradients
        torch.set_rng_state(snapshot[1])
        if snapshot[2] is not None:
            torch.cuda.set_rng_state(snapshot[2], self.engine.device)
        self.log.record(change)
        return True

    def _lower(self, budget: MicroBudget, batch: Batch) -> Change | None:
        """Halve the budget, else turn checkpointing on; the change, or None (with a note why not)."""
        dynamic = budget.max_token_len is not None
        now = budget.max_token_len if dynamic else budget.micro_batch_size
        assert now is not None
        low = max(self.floor, int(batch["attention_mask"].sum(-1).max())) if dynamic else 1
        new = max(now // 2, low)
        if self.budget_free and new < now:
            if dynamic:
                budget.max_token_len = new
            else:
                budget.micro_batch_size = new
            return Change(self.stage, self.budget_key, now, new)
        if self.ckpt_free and self.ckpt_key is not None and not get_key(self.log.cfg, self.ckpt_key) \
                and switch_checkpointing(self.engine.module, True) > 0:
            return Change(self.stage, self.ckpt_key, False, True)
        self.log.notes[self.stage] = self._why_not(now, new)
        return None

    def _why_not(self, now: int, new: int) -> str:
        """The note for an error back-off could not answer."""
        if not self.budget_free:
            return (f"online back-off left {self.budget_key}={now} alone because you set it "
                    "(leave it unset or =auto to let rlforge halve it)")
        done = [c for c in self.log.changes if c.stage == self.stage]
        if done:
            return (f"online back-off already lowered this stage ({'; '.join(f'{c.key} {c.before} -> {c.after}' for c in done)})"
                    " and has nothing left to lower")
        return f"online back-off has nothing left to lower ({self.budget_key} is at its minimum {now})"


def _stage_parts(job: Any) -> dict[str, tuple[MicroBudget, Any]]:
    """Stage -> (its :class:`MicroBudget`, its engine), for the roles ``job`` has."""
    parts: dict[str, tuple[MicroBudget, Any]] = {
        "old_log_prob": (job.actor.budget, job.actor.engine),
        "update_actor": (job.actor.train_budget, job.actor.engine),
    }
    if job.reference is not None:
        parts["ref"] = (job.reference.budget, job.reference.engine)
    if job.critic is not None:
        parts["values"] = (job.critic.forward_budget, job.critic.engine)
        parts["update_critic"] = (job.critic.budget, job.critic.engine)
    return parts


def install_backoff(cfg: Any, job: Any, world_size: int, out: Callable[[str], None] | None = None) -> Backoffs:
    """Attach a :class:`StageBackoff` to every micro-batched stage of ``job`` (single process only)
    and return the run's :class:`Backoffs`."""
    log = Backoffs(cfg, out)
    log.single_process = world_size == 1
    if not log.single_process:
        return log
    floor = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    for stage, (budget, engine) in _stage_parts(job).items():
        redo = StageBackoff(log, stage, engine, budget_key(cfg, stage), floor, checkpoint_key(stage))
        budget.redo = redo
        if redo.budget_free:
            log.values[redo.budget_key] = functools.partial(_current, budget)
        if redo.ckpt_free and redo.ckpt_key is not None:
            log.values[redo.ckpt_key] = functools.partial(_flag, cfg, redo.ckpt_key)
    return log


def _current(budget: MicroBudget) -> float:
    return float(budget.max_token_len if budget.max_token_len is not None else budget.micro_batch_size)


def _flag(cfg: Any, key: str) -> float:
    return float(bool(get_key(cfg, key)))

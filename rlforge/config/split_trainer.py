"""verl's fully-async trainer's batch size, read on rlforge's colocated trainer.

verl's fully-async scripts set ``data.train_batch_size=0``: there the rollouter streams samples and the
trainer takes ``async_training.require_batches`` mini-batches (``actor.ppo_mini_batch_size`` prompts each) per
update.  rlforge trains colocated, one batch per step, so under verl's ``async_training.*`` keys a
``data.train_batch_size`` of 0 becomes ``require_batches x ppo_mini_batch_size``: the prompts verl's trainer
updates on in one step.  The value rlforge took is said in one warning line (:func:`split_batch_warnings`).
Anywhere else 0 stays an error (:mod:`rlforge.config.ranges`).

Their ``async_training.partial_rollout=true`` (verl: the rollouter's unfinished responses continue after a
parameter sync) is rlforge's partial rollout where that can run (one process, the single-turn native engine,
no dynamic sampling).  Where it cannot, a verl fully-async run trains synchronously, with one warning naming
why; set by the user on rlforge's own terms (no verl split-trainer key), the same combination stays an error
(:mod:`rlforge.config.async_training`).
"""

from __future__ import annotations

from typing import Any

from rlforge.config.async_training import partial_rollout_blocker
from rlforge.config.user_keys import verl_values
from rlforge.errors import ConfigError

_ATTR = "_rlforge_split_train_batch"
REQUIRE_BATCHES_DEFAULT = 1
"""verl's default of ``async_training.require_batches`` (its ``fully_async_ppo_trainer.yaml``)."""


def split_trainer_batch(cfg: Any) -> None:
    """In place: ``data.train_batch_size`` 0, and ``partial_rollout`` where it cannot run, under verl's
    ``async_training.*`` keys (module doc)."""
    verl = verl_values(cfg)
    if not any(k.startswith("async_training.") for k in verl):
        return
    _partial_rollout_off(cfg)
    if cfg.data.train_batch_size != 0:
        return
    require = _require_batches(verl.get("async_training.require_batches"))
    mini = int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    cfg.data.train_batch_size = require * mini
    setattr(cfg, _ATTR, (require, mini))


def _require_batches(value: Any) -> int:
    """``async_training.require_batches`` (null: verl's default, 1); raises ConfigError unless a whole number >= 1."""
    if value is None:
        return REQUIRE_BATCHES_DEFAULT
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"async_training.require_batches={value!r}: must be a whole number >= 1 (the mini-batches "
                          "of actor_rollout_ref.actor.ppo_mini_batch_size prompts that make a step's batch when "
                          "data.train_batch_size=0)")
    return value


_OFF_ATTR = "_rlforge_split_partial_off"


def _partial_rollout_off(cfg: Any) -> None:
    if not cfg.async_training.partial_rollout:
        return
    try:
        why = partial_rollout_blocker(cfg)
    except ConfigError:  # a bad world size: validation names it; here it does not turn partial rollout off
        why = None
    if why is not None:
        cfg.async_training.partial_rollout = False
        setattr(cfg, _OFF_ATTR, why)


def split_batch_warnings(cfg: Any, others: list[str]) -> list[str]:
    """``others`` (the config's other warnings) and the lines that say what :func:`split_trainer_batch` chose;
    where it sized the batch from ``async_training.require_batches``, that key's "ignored" line is dropped."""
    taken, why = getattr(cfg, _ATTR, None), getattr(cfg, _OFF_ATTR, None)
    out = [w for w in others if taken is None or not w.startswith("async_training.require_batches=")]
    if why is not None:
        out.append(f"async_training.partial_rollout=true (verl's fully-async trainer): rlforge's partial rollout is "
                   f"off for this run, because it {why}; each step generates and trains synchronously")
    if taken is not None:
        require, mini = taken
        out.append(f"data.train_batch_size=0 (verl's fully-async trainer: the rollouter streams batches) trains "
                   f"async_training.require_batches x actor_rollout_ref.actor.ppo_mini_batch_size = {require} x "
                   f"{mini} = {require * mini} prompts per step here (rlforge trains colocated, one batch per step)")
    return out

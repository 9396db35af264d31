"""``async_training``: partial rollout on the GPUs that train (verl's section of the same name).

verl's keys (``verl/experimental/fully_async_policy/config/fully_async_ppo_trainer.yaml``,
``docs/advance/fully_async.md``) that rlforge reads:

* ``partial_rollout``: responses still unfinished when a step has enough finished groups are kept,
  tokens and all, and continued in the next step under the updated policy
  (:mod:`rlforge.trainer.partial_rollout`);
* ``staleness_threshold``: the share of extra samples the rollout may produce beyond one step's
  batch (verl: ``rollout_num = (1 + staleness_threshold) x batch``); here,
  ``ceil(staleness_threshold x data.train_batch_size)`` extra prompt groups are queued per step.

verl has no key for a bound on a token's age in policy versions (its fully-async trainer bounds the
share of stale samples only); these two are rlforge's, named in verl's style:

* ``max_version_gap``: tokens sampled more than this many policy versions (optimizer updates) before
  the one being trained are stale; null = no bound;
* ``stale_mode``: ``mask`` drops stale tokens from the loss (``response_mask``); ``drop`` discards a
  carried response that holds a stale token and samples it again from its prompt.

The other keys of verl's section (``trigger_parameter_sync_step``, ``require_batches``,
``checkpoint_engine``, ...) belong to its separate rollout/trainer GPUs and are not accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlforge.errors import ConfigError

STALE_MODES = ("mask", "drop")
GROUP_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg", "grpo_passk")
"""Estimators whose baseline is a prompt group's other responses (as ``rlforge.config.validate``)."""


@dataclass
class AsyncTrainingConfig:
    """verl's ``async_training`` section (the keys one training GPU set can use)."""

    partial_rollout: bool = False
    """Keep unfinished responses and continue them next step under the new policy (verl's key)."""
    staleness_threshold: float = 0.0
    """Extra prompt groups queued per step, as a share of ``data.train_batch_size`` (verl's key)."""
    max_version_gap: int | None = None
    """Tokens older than this many policy versions are stale (rlforge's key; null = no bound)."""
    stale_mode: str = "mask"
    """``mask`` (stale tokens out of the loss) or ``drop`` (a carried response with one restarts) (rlforge's key)."""


def extra_groups(cfg: Any) -> int:
    """Prompt groups queued per step beyond ``data.train_batch_size`` (0 without partial rollout)."""
    at = cfg.async_training
    share = float(at.staleness_threshold)
    if not at.partial_rollout:
        return 0
    return math.ceil(round(share * int(cfg.data.train_batch_size), 9))


def partial_rollout_blocker(cfg: Any) -> str | None:
    """Why ``async_training.partial_rollout`` cannot run with the rest of ``cfg``, or None where it can.

    The reason reads after "partial_rollout=true" / "it" ("needs ...", "does not run with ...", "runs in one
    process ..."), naming the key that stops it.  One list for both callers: :func:`check_config` raises it
    as a ConfigError; :mod:`rlforge.config.split_trainer` (verl's split-trainer keys) turns partial rollout
    off with it as a warning.  The ``partial_rollout`` value itself is not read.

    Raises:
        ConfigError: the run's world size is itself bad (:func:`rlforge.config.world.run_world`).
    """
    arr = cfg.actor_rollout_ref
    if arr.rollout.name == "hf":
        return (f"needs actor_rollout_ref.rollout.name=native (got {arr.rollout.name}): only the native engine "
                "continues a stopped response")
    if arr.rollout.multi_turn.enable:
        return "does not run with actor_rollout_ref.rollout.multi_turn.enable"
    if cfg.algorithm.filter_groups.enable:
        return "does not run with algorithm.filter_groups.enable (dynamic sampling)"
    from rlforge.config.world import run_world

    world = run_world(cfg)
    if world.size > 1:
        return f"runs in one process in this build, and this run has {world.size} ({world.source})"
    return None


def check_config(cfg: Any) -> None:
    """Raises ConfigError (one line, naming the key) for a bad ``async_training`` value or a
    combination partial rollout cannot run with."""
    at, key = cfg.async_training, "async_training"
    if at.max_version_gap is not None and int(at.max_version_gap) < 0:
        raise ConfigError(f"{key}.max_version_gap={at.max_version_gap}: must be >= 0 (0 = only tokens of the policy "
                          "being trained; null = no bound)")
    if not float(at.staleness_threshold) >= 0:
        raise ConfigError(f"{key}.staleness_threshold={at.staleness_threshold}: must be >= 0 (the share of extra "
                          "prompt groups queued per step)")
    if at.stale_mode not in STALE_MODES:
        raise ConfigError(f"{key}.stale_mode={at.stale_mode!r}: expected one of {', '.join(STALE_MODES)}")
    if not at.partial_rollout:
        return
    arr = cfg.actor_rollout_ref
    n, est = int(arr.rollout.n), cfg.algorithm.adv_estimator
    if n == 1 and est in GROUP_ESTIMATORS and float(at.staleness_threshold) > 0:
        raise ConfigError(f"{key}.staleness_threshold={at.staleness_threshold} over-provisions prompt groups, but "
                          f"actor_rollout_ref.rollout.n=1 with algorithm.adv_estimator={est}: a one-response group has "
                          "no baseline. Set rollout.n >= 2 or staleness_threshold=0")
    why = partial_rollout_blocker(cfg)
    if why is not None:
        raise ConfigError(f"{key}.partial_rollout=true {why}")
    if float(at.staleness_threshold) > 1:
        raise ConfigError(f"{key}.staleness_threshold={at.staleness_threshold}: at most 1 in this build (one extra "
                          "batch of prompt groups queued per step)")

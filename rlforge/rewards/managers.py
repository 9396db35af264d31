"""verl's other reward managers (``reward_model.reward_manager``), and the builder from the config.

* ``batch`` (verl's ``BatchRewardManager``, ``verl/workers/reward_manager/batch.py``): the user's
  function is called ONCE per batch with lists,
  ``compute_score(data_sources=[...], solution_strs=[...], ground_truths=[...], extra_infos=[...],
  **reward_kwargs)``, and returns one number or dict per sample.  With ``reward_model.timeout_s``
  the one call runs in a worker process under that limit (for the whole call); a timeout fails
  every sample of the batch.  The function may return a list, a tuple, or a 1-D numpy array or
  torch tensor; a wrong length is one error naming the function (:func:`score_list`).
* ``prime`` (the idea of verl's ``PrimeRewardManager``): samples are scored in parallel by
  ``reward_model.num_workers`` processes (:class:`rlforge.rewards.pool.ScorerPool`), for CPU-heavy
  scorers; ``reward_model.timeout_s`` applies per sample, and a dead worker is replaced.
* ``dapo`` (verl's ``DAPORewardManager``): ``naive`` plus the ``acc`` extra key (the raw score
  before the overlong penalty, unless the function returns its own ``acc``).  The overlong buffer
  (``reward_model.overlong_buffer``) is applied by every manager in rlforge, not only ``dapo``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from rlforge.errors import ConfigError, RewardError
from rlforge.rewards.exits import USER_EXITS, SigintWatch, exit_error, exit_reason
from rlforge.rewards.manager import REWARD_MANAGERS, RewardManager
from rlforge.rewards.pool import Outcome


@REWARD_MANAGERS.register("batch")
class BatchRewardManager(RewardManager):
    """verl's ``batch`` manager: one call of the function on the whole batch's lists."""

    def _compute(self, samples: list[dict[str, Any]]) -> list[Outcome]:
        sources = [s["data_source"] for s in samples]
        lists = {
            "data_sources": sources,
            "solution_strs": [s["solution_str"] for s in samples],
            "ground_truths": [s["ground_truth"] for s in samples],
            "extra_infos": [s["extra_info"] for s in samples],
        }
        where = batch_where(self.fn_desc, sources)
        if self.timeout_s is not None:
            (one,) = self._pool_of(1).map([lists])
            if one.exited:
                raise exit_error(where, one.error)
        else:
            with SigintWatch() as sigint:
                try:
                    one = Outcome(True, value=self.fn(**lists))
                except Exception as e:  # noqa: BLE001 - every sample's error, handled in score()
                    one = Outcome(False, error=f"{type(e).__name__}: {e}", raised=True)
                except USER_EXITS as e:
                    if not sigint.is_user_exit(e):
                        raise  # a real Ctrl-C of the trainer
                    raise exit_error(where, exit_reason(e)) from e
        if not one.ok:
            return [one] * len(samples)
        return [Outcome(True, value=v) for v in score_list(one.value, len(samples), where)]


def batch_where(fn_desc: str, sources: Sequence[str]) -> str:
    """How errors name one batch call: ``reward function <fn> on a batch of N samples (data_source=...)``."""
    names = sorted(set(map(str, sources)))
    shown = ", ".join(repr(n) for n in names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return f"reward function {fn_desc} on a batch of {len(sources)} samples (data_source={shown})"


def score_list(values: Any, n: int, where: str) -> list[Any]:
    """The per-sample results of a batch function: a list or tuple, or a 1-D numpy array or torch
    tensor (converted with ``tolist()``), of length ``n``.  Items are checked later, one per sample
    (:func:`rlforge.rewards.custom.check_result`: numbers, numpy/torch scalars or dicts).

    Raises:
        RewardError: anything else, or a wrong length; names ``where`` (function and batch).
    """
    if hasattr(values, "tolist") and hasattr(values, "shape") and not isinstance(values, str | bytes):
        shape = tuple(values.shape)
        if len(shape) != 1:
            raise RewardError(f"{where} returned {type(values).__name__} of shape {shape}, expected a 1-D list "
                              f"of {n} scores (reward_model.reward_manager=batch)")
        values = values.tolist()
    if not isinstance(values, Sequence) or isinstance(values, str | bytes) or len(values) != n:
        got = f"{type(values).__name__} of length {len(values)}" if hasattr(values, "__len__") else \
            type(values).__name__
        raise RewardError(f"{where} returned {got}, expected a list of {n} scores, one per sample "
                          "(reward_model.reward_manager=batch)")
    return list(values)


@REWARD_MANAGERS.register("prime")
class PrimeRewardManager(RewardManager):
    """verl's ``prime`` manager: a pool of ``num_workers`` processes scores samples in parallel."""

    def _compute(self, samples: list[dict[str, Any]]) -> list[Outcome]:
        return self._pool_of(self.num_workers).map(samples)


@REWARD_MANAGERS.register("dapo")
class DAPORewardManager(RewardManager):
    """verl's ``dapo`` manager: ``naive`` that also reports ``acc`` (the score before the penalty)."""

    def _postprocess(self, scores: list[float], extras: list[dict[str, Any]]) -> None:
        for s, ex in zip(scores, extras, strict=True):
            ex.setdefault("acc", s)


def num_workers_of(value: int) -> int:
    """``reward_model.num_workers``: 0 = ``os.cpu_count()`` capped at 16; else the value."""
    return min(16, os.cpu_count() or 1) if value == 0 else int(value)


def build_reward_manager(cfg: Any, tokenizer: Any) -> RewardManager:
    """Build the manager named by ``cfg.reward_model.reward_manager`` from verl's config keys
    ``custom_reward_function.{path,name,reward_kwargs}``, ``data.reward_fn_key`` and
    ``reward_model.overlong_buffer.{enable,len,penalty_factor}``, and rlforge's own
    ``reward_model.{timeout_s,failure_score,num_workers}``.

    Raises:
        ConfigError: unknown ``reward_model.reward_manager`` (one line listing the valid names), or
            a bad ``timeout_s`` / ``num_workers``.
        RewardError: the custom function cannot be loaded.
    """
    rm = cfg.reward_model
    cls = REWARD_MANAGERS.get(rm.reward_manager)
    custom = cfg.custom_reward_function
    ob = rm.overlong_buffer
    overlong = (int(cfg.data.max_response_length), int(ob.len), float(ob.penalty_factor)) if ob.enable else None
    timeout_s = rm.timeout_s
    if timeout_s is not None and not float(timeout_s) > 0:
        raise ConfigError(f"reward_model.timeout_s={timeout_s} must be > 0 seconds, or null for no limit")
    num_workers = int(rm.num_workers)
    if num_workers < 0:
        raise ConfigError(f"reward_model.num_workers={num_workers} must be >= 1, or 0 for the CPU count (max 16)")
    kwargs = dict(custom.reward_kwargs or {})
    return cls(
        tokenizer, custom_path=custom.path, custom_name=custom.name, reward_fn_key=cfg.data.reward_fn_key,
        overlong=overlong, reward_kwargs=kwargs if custom.path else None,
        timeout_s=None if timeout_s is None else float(timeout_s),
        failure_score=float(rm.failure_score), num_workers=num_workers_of(num_workers),
    )

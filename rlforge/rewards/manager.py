"""Reward manager: decode responses, score them, place scores on tokens.

Source: verl's ``NaiveRewardManager`` (``verl/workers/reward_manager/naive.py``): the score of
each response is put on its LAST valid response token and the rest of the row is zero.
A custom function (``custom_reward_function.path``) replaces the data-source rules for all
samples, as in verl; ``custom_reward_function.reward_kwargs`` are passed to it as extra keywords.

:class:`RewardManager` is verl's ``naive`` manager: one sample after another, in the trainer's
process, or, with ``reward_model.timeout_s`` set, in one worker process that is killed and
replaced when a sample runs past the limit (:mod:`rlforge.rewards.pool`).  The other managers
(``batch``, ``prime``, ``dapo``: :mod:`rlforge.rewards.managers`) change only :meth:`_compute`.

Failures (rlforge's own policy; verl stops on a raising scorer and ``prime`` scores 0): a sample
whose scorer times out, raises, returns a non-number or kills its worker gets
``reward_model.failure_score``, is counted in ``reward/timeouts`` or ``reward/errors``, and
is named in a warning (index and data_source).  When EVERY sample of a batch fails with an
error (not a timeout), the function is broken rather than flaky and :meth:`score` raises.  A
function that calls ``sys.exit`` or raises ``KeyboardInterrupt`` stops the run at once with a
RewardError naming it and the sample (:mod:`rlforge.rewards.exits`; a real Ctrl-C stays a Ctrl-C).

Zero-length responses (``response_mask`` all zero) get their score at index 0.
"""

from __future__ import annotations

import logging
import math
import numbers
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.errors import RewardError
from rlforge.registry import Registry
from rlforge.rewards.custom import check_result, load_custom_reward_function, sample_where
from rlforge.rewards.decode import decode_masked
from rlforge.rewards.exits import USER_EXITS, SigintWatch, exit_error, exit_reason
from rlforge.rewards.numeric import looks_like_float_column
from rlforge.rewards.overlong import overlong_penalty
from rlforge.rewards.pool import Outcome, ScorerPool
from rlforge.rewards.rules import default_compute_score

logger = logging.getLogger(__name__)

MAX_WARNINGS_PER_BATCH = 8
"""Failed samples named one per line in a batch; the rest are summed up in one more line."""

SLOW_SAMPLE_S = 10.0
"""Without ``reward_model.timeout_s``, a sample that takes longer than this (seconds) to score in the
trainer's process gets a warning that suggests the key (it cannot be interrupted there)."""


@dataclass
class RewardOutput:
    """Scores of one batch.

    Attributes:
        token_level_scores: (B, R) float32; the score on the last valid response token.
        scores: (B,) float32; one score per response.
        extra: numeric extra keys returned by dict-returning functions, one list of length B
            per key (NaN for samples that did not return that key).
        extra_text: non-numeric extra values, as strings ("" where missing).
        decoded: the decoded responses (special tokens skipped), for logging.
        metrics: ``reward/timeouts`` and ``reward/errors``: failed samples in this batch.
    """

    token_level_scores: torch.Tensor
    scores: torch.Tensor
    extra: dict[str, list[float]] = field(default_factory=dict)
    extra_text: dict[str, list[str]] = field(default_factory=dict)
    decoded: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)


def last_valid_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in each row of ``response_mask`` (B, R); 0 for an all-zero row. Shape (B,)."""
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    return (
        (positions * (response_mask != 0)).amax(dim=-1) if response_mask.shape[-1] else positions.new_zeros(0)
    )


class RewardManager:
    """Scores a batch of responses with data-source rules or a custom function (verl's ``naive``).

    Args:
        tokenizer: decodes ``responses``.
        custom_path: ``custom_reward_function.path`` (a ``.py`` file) or None for the rules.
        custom_name: ``custom_reward_function.name``.
        reward_fn_key: ``data.reward_fn_key``: the non-tensor field passed as ``data_source``.
        overlong: ``(max_response_length, buffer_len, penalty_factor)`` to add DAPO's overlong
            penalty (:mod:`rlforge.rewards.overlong`) to every score, or None.
        reward_kwargs: ``custom_reward_function.reward_kwargs``, extra keywords for the function.
        timeout_s: ``reward_model.timeout_s``: per-sample limit in seconds; None = no limit.
        failure_score: ``reward_model.failure_score``: the score of a timed-out or failed sample.
        num_workers: ``reward_model.num_workers``: processes of the ``prime`` pool.

    Raises:
        RewardError: the custom file/function cannot be loaded.
    """

    def __init__(
        self,
        tokenizer: Any,
        custom_path: str | None = None,
        custom_name: str = "compute_score",
        reward_fn_key: str = "data_source",
        overlong: tuple[int, int, float] | None = None,
        reward_kwargs: dict[str, Any] | None = None,
        timeout_s: float | None = None,
        failure_score: float = 0.0,
        num_workers: int = 1,
    ) -> None:
        self.tokenizer = tokenizer
        self.overlong = overlong
        self.reward_fn_key = reward_fn_key
        self.timeout_s = timeout_s
        self.failure_score = float(failure_score)
        self.num_workers = max(1, int(num_workers))
        self._pool: ScorerPool | None = None
        self._warned_float_truths = False
        custom_name = custom_name or "compute_score"
        if custom_path:
            fn: Callable[..., Any] = load_custom_reward_function(custom_path, custom_name)
            self.fn_desc = f"{custom_name}() in {custom_path}"
        else:
            fn = default_compute_score
            self.fn_desc = "default_compute_score (rules by data_source)"
        self.fn = partial(fn, **reward_kwargs) if reward_kwargs else fn

    def decode(self, responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        """Decode the tokens where ``response_mask`` is 1, skipping special tokens."""
        return decode_masked(self.tokenizer, responses, response_mask)

    # ------------------------------------------------------------------ the part a manager changes

    def _pool_of(self, num_workers: int) -> ScorerPool:
        if self._pool is None:
            self._pool = ScorerPool(self.fn, num_workers, self.timeout_s)
        return self._pool

    def _compute(self, samples: list[dict[str, Any]]) -> list[Outcome]:
        """Raw outputs of the function on each sample's keywords (``data_source``, ``solution_str``,
        ``ground_truth``, ``extra_info``): in this process, or in a one-process pool with a timeout."""
        if self.timeout_s is not None:
            return self._pool_of(1).map(samples)
        out: list[Outcome] = []
        slow: list[tuple[int, float]] = []
        with SigintWatch() as sigint:
            for i, s in enumerate(samples):
                t0 = time.monotonic()
                try:
                    out.append(Outcome(True, value=self.fn(**s)))
                except Exception as e:  # noqa: BLE001 - the sample's error, handled in score()
                    out.append(Outcome(False, error=f"{type(e).__name__}: {e}", raised=True))
                except USER_EXITS as e:
                    if not sigint.is_user_exit(e):
                        raise  # a real Ctrl-C of the trainer
                    raise exit_error(sample_where(self.fn_desc, i, s["data_source"]), exit_reason(e)) from e
                if (dt := time.monotonic() - t0) > SLOW_SAMPLE_S:
                    slow.append((i, dt))
        if slow:
            i, dt = max(slow, key=lambda x: x[1])
            logger.warning(
                "%s took %.1f s (%d samples of this batch over %g s) in the trainer's process; set "
                "reward_model.timeout_s to cap each sample (it then runs in a worker process that is killed "
                "past the limit)", sample_where(self.fn_desc, i, samples[i]["data_source"]), dt, len(slow),
                SLOW_SAMPLE_S)
        return out

    def _postprocess(self, scores: list[float], extras: list[dict[str, Any]]) -> None:
        """Hook for managers that add extra keys (``dapo``'s ``acc``); the default does nothing."""

    # ------------------------------------------------------------------ the stage

    def score(self, batch: Batch) -> RewardOutput:
        """Score every response of ``batch``.

        Reads tensors ``responses`` (B, R) long and ``response_mask`` (B, R), and non-tensor
        ``<reward_fn_key>``, ``ground_truth`` and ``extra_info``.  After a multi-turn rollout (non-tensor
        ``reward_scores`` and ``multi_turn/num_turns`` present) each sample's ``extra_info`` given to the
        function is a copy with verl's ``rollout_reward_scores`` (``{tool name: calc_reward value,
        "user_turn_rewards": [...]}``) and ``num_turns`` added; as in verl, these rewards reach the score
        only through the function (the built-in rules ignore them).

        Raises:
            RewardError: a field is missing, or every sample's scorer failed with an error (the
                message is the first sample's: index, data_source and what went wrong), or the
                function called ``sys.exit`` / raised ``KeyboardInterrupt`` (names that sample).
        """
        for key in (self.reward_fn_key, "ground_truth"):
            if key not in batch.non_tensor:
                raise RewardError(
                    f"batch has no non-tensor field {key!r} (data.reward_fn_key={self.reward_fn_key!r})"
                )
        responses, mask = batch["responses"], batch["response_mask"]
        decoded = self.decode(responses, mask)
        n = len(decoded)
        extra_infos = batch.non_tensor.get("extra_info")
        sources = [str(s) for s in batch.non_tensor[self.reward_fn_key]]
        truths = list(batch.non_tensor["ground_truth"])
        rollout_scores = batch.non_tensor.get("reward_scores")
        num_turns = batch.non_tensor.get("multi_turn/num_turns")
        infos: list[Any] = []
        for i in range(n):
            info = extra_infos[i] if extra_infos is not None else None
            if rollout_scores is not None and num_turns is not None:  # verl: the tools' rewards reach the function
                info = {**(info if isinstance(info, dict) else {}), "rollout_reward_scores": rollout_scores[i],
                        "num_turns": int(num_turns[i])}
            infos.append(info)
        samples = [
            {"data_source": sources[i], "solution_str": decoded[i], "ground_truth": truths[i],
             "extra_info": infos[i]}
            for i in range(n)
        ]
        outcomes = self._compute(samples) if n else []
        scores, extras, metrics = self._check(outcomes, sources)
        self._postprocess(scores, extras)
        self._warn_float_truths(scores, truths)
        scores_t = torch.tensor(scores, dtype=torch.float32)
        extra, extra_text = _collect_extras(extras, self.fn_desc)
        if self.overlong is not None:
            lengths = (mask.cpu() != 0).sum(-1)
            penalty = overlong_penalty(lengths, *self.overlong)
            scores_t = scores_t + penalty
            extra["overlong_reward"] = penalty.tolist()
            extra["overlong"] = (penalty < 0).float().tolist()
        token_level = torch.zeros(responses.shape, dtype=torch.float32)
        if responses.shape[-1]:
            token_level[torch.arange(n), last_valid_index(mask.cpu())] = scores_t
        return RewardOutput(token_level.to(responses.device), scores_t, extra, extra_text, decoded, metrics)

    def _check(
        self, outcomes: list[Outcome], sources: list[str]
    ) -> tuple[list[float], list[dict[str, Any]], dict[str, float]]:
        """Scores and extras from raw outcomes; failures become ``failure_score`` with a warning."""
        scores: list[float] = []
        extras: list[dict[str, Any]] = []
        failures: list[str] = []
        num_timeouts = num_errors = 0
        for i, o in enumerate(outcomes):
            where = sample_where(self.fn_desc, i, sources[i])
            if o.exited:
                raise exit_error(where, o.error)
            try:
                if o.timed_out:
                    raise RewardError(f"{where} {o.error}")
                if not o.ok:
                    raise RewardError(f"{where} raised {o.error}" if o.raised else f"{where}: {o.error}")
                s, ex = check_result(o.value, where)
            except RewardError as e:
                num_timeouts += o.timed_out
                num_errors += not o.timed_out
                failures.append(str(e))
                s, ex = self.failure_score, {}
            scores.append(s)
            extras.append(ex)
        if outcomes and num_errors == len(outcomes):
            raise RewardError(failures[0] if len(failures) == 1 else
                              f"{failures[0]} (and every other sample of the batch failed too)")
        for msg in failures[:MAX_WARNINGS_PER_BATCH]:
            logger.warning("%s; scored reward_model.failure_score=%g", msg, self.failure_score)
        if len(failures) > MAX_WARNINGS_PER_BATCH:
            logger.warning("... and %d more failed samples in this batch", len(failures) - MAX_WARNINGS_PER_BATCH)
        return scores, extras, {"reward/timeouts": float(num_timeouts), "reward/errors": float(num_errors)}

    def _warn_float_truths(self, scores: list[float], truths: list[Any]) -> None:
        """One warning per manager when a batch scores all zeros and its ground truths look like floats."""
        if self._warned_float_truths or not scores or any(s != 0 for s in scores):
            return
        if looks_like_float_column(truths):
            self._warned_float_truths = True
            logger.warning(
                "every reward in this batch is 0 and every ground truth looks like a float (e.g. %r): column "
                "reward_model.ground_truth was probably stored as float64 (pandas does this to an integer column "
                "with a missing value). The built-in math rules compare numbers by value; a custom "
                "reward function comparing strings will not match '7' to '7.0'. Write the column as strings or "
                "integers, or compare numerically in the function.", truths[0],
            )

    def close(self) -> None:
        """Stop the worker processes, if any were started."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _collect_extras(extras: list[dict[str, Any]], fn_desc: str = "the reward function"
                    ) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    """Extra keys by name: numeric ones as floats (NaN where a sample has no value), others as strings.
    A non-finite number (NaN, inf) is left out like a missing value, with one warning per key naming
    ``fn_desc``, so it cannot reach ``reward_extra/<key>/mean``."""
    keys = sorted({k for ex in extras for k in ex})
    numeric: dict[str, list[float]] = {}
    text: dict[str, list[str]] = {}
    for k in keys:
        values = [ex.get(k) for ex in extras]
        if all(v is None or (isinstance(v, numbers.Real)) for v in values):
            bad = [i for i, v in enumerate(values) if v is not None and not math.isfinite(float(v))]
            if bad:
                logger.warning("%s returned a non-finite %r (%r) for %d of %d samples (first: sample %d); left out "
                               "of reward_extra/%s/mean", fn_desc, k, values[bad[0]], len(bad), len(values), bad[0], k)
            numeric[k] = [math.nan if v is None or i in bad else float(v) for i, v in enumerate(values)]
        else:
            text[k] = ["" if v is None else str(v) for v in values]
    return numeric, text


REWARD_MANAGERS: Registry[type[RewardManager]] = Registry("reward manager", "reward_model.reward_manager")
"""verl's reward-manager names (``reward_model.reward_manager``); entries in :mod:`rlforge.rewards.managers`."""
REWARD_MANAGERS.register("naive")(RewardManager)

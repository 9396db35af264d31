"""Reward manager: decode responses, score them, place scores on tokens.

Source: verl's ``NaiveRewardManager`` (``verl/workers/reward_manager/naive.py``): the score of
each response is put on its LAST valid response token and the rest of the row is zero.
A custom function (``custom_reward_function.path``) replaces the data-source rules for all
samples, as in verl.

Zero-length responses (``response_mask`` all zero) get their score at index 0.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.errors import RewardError
from rlforge.registry import Registry
from rlforge.rewards.custom import call_reward_fn, load_custom_reward_function
from rlforge.rewards.overlong import overlong_penalty
from rlforge.rewards.rules import default_compute_score


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
    """

    token_level_scores: torch.Tensor
    scores: torch.Tensor
    extra: dict[str, list[float]] = field(default_factory=dict)
    extra_text: dict[str, list[str]] = field(default_factory=dict)
    decoded: list[str] = field(default_factory=list)


def last_valid_index(response_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last 1 in each row of ``response_mask`` (B, R); 0 for an all-zero row. Shape (B,)."""
    positions = torch.arange(response_mask.shape[-1], device=response_mask.device)
    return (
        (positions * (response_mask != 0)).amax(dim=-1) if response_mask.shape[-1] else positions.new_zeros(0)
    )


class RewardManager:
    """Scores a batch of responses with data-source rules or a custom function.

    Args:
        tokenizer: decodes ``responses``.
        custom_path: ``custom_reward_function.path`` (a ``.py`` file) or None for the rules.
        custom_name: ``custom_reward_function.name``.
        reward_fn_key: ``data.reward_fn_key``: the non-tensor field passed as ``data_source``.
        overlong: ``(max_response_length, buffer_len, penalty_factor)`` to add DAPO's overlong
            penalty (:mod:`rlforge.rewards.overlong`) to every score, or None.

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
    ) -> None:
        self.tokenizer = tokenizer
        self.overlong = overlong
        self.reward_fn_key = reward_fn_key
        custom_name = custom_name or "compute_score"
        if custom_path:
            self.fn = load_custom_reward_function(custom_path, custom_name)
            self.fn_desc = f"{custom_name}() in {custom_path}"
        else:
            self.fn = default_compute_score
            self.fn_desc = "default_compute_score (rules by data_source)"

    def decode(self, responses: torch.Tensor, response_mask: torch.Tensor) -> list[str]:
        """Decode the tokens where ``response_mask`` is 1, skipping special tokens."""
        rows = [r[m != 0].tolist() for r, m in zip(responses.cpu(), response_mask.cpu(), strict=True)]
        return list(self.tokenizer.batch_decode(rows, skip_special_tokens=True))

    def score(self, batch: Batch) -> RewardOutput:
        """Score every response of ``batch``.

        Reads tensors ``responses`` (B, R) long and ``response_mask`` (B, R), and non-tensor
        ``<reward_fn_key>``, ``ground_truth`` and ``extra_info``.  After a multi-turn rollout (non-tensor
        ``reward_scores`` and ``multi_turn/num_turns`` present) each sample's ``extra_info`` given to the
        function is a copy with verl's ``rollout_reward_scores`` (``{tool name: calc_reward value,
        "user_turn_rewards": [...]}``) and ``num_turns`` added; as in verl, these rewards reach the score
        only through the function (the built-in rules ignore them).

        Raises:
            RewardError: a field is missing, or a reward function fails (see
                :func:`rlforge.rewards.custom.call_reward_fn`).
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
        scores: list[float] = []
        extras: list[dict[str, Any]] = []
        rollout_scores = batch.non_tensor.get("reward_scores")
        num_turns = batch.non_tensor.get("multi_turn/num_turns")
        for i in range(n):
            info = extra_infos[i] if extra_infos is not None else None
            if rollout_scores is not None and num_turns is not None:
                info = {**(info if isinstance(info, dict) else {}), "rollout_reward_scores": rollout_scores[i],
                        "num_turns": int(num_turns[i])}
            s, ex = call_reward_fn(
                self.fn,
                self.fn_desc,
                i,
                str(batch.non_tensor[self.reward_fn_key][i]),
                decoded[i],
                batch.non_tensor["ground_truth"][i],
                info,
            )
            scores.append(s)
            extras.append(ex)
        scores_t = torch.tensor(scores, dtype=torch.float32)
        extra, extra_text = _collect_extras(extras)
        if self.overlong is not None:
            lengths = (mask.cpu() != 0).sum(-1)
            penalty = overlong_penalty(lengths, *self.overlong)
            scores_t = scores_t + penalty
            extra["overlong_reward"] = penalty.tolist()
            extra["overlong"] = (penalty < 0).float().tolist()
        token_level = torch.zeros(responses.shape, dtype=torch.float32)
        if responses.shape[-1]:
            token_level[torch.arange(n), last_valid_index(mask.cpu())] = scores_t
        return RewardOutput(token_level.to(responses.device), scores_t, extra, extra_text, decoded)


def _collect_extras(extras: list[dict[str, Any]]) -> tuple[dict[str, list[float]], dict[str, list[str]]]:
    keys = sorted({k for ex in extras for k in ex})
    numeric: dict[str, list[float]] = {}
    text: dict[str, list[str]] = {}
    for k in keys:
        values = [ex.get(k) for ex in extras]
        if all(v is None or (isinstance(v, numbers.Real)) for v in values):
            numeric[k] = [math.nan if v is None else float(v) for v in values]
        else:
            text[k] = ["" if v is None else str(v) for v in values]
    return numeric, text


REWARD_MANAGERS: Registry[type[RewardManager]] = Registry("reward manager", "reward_model.reward_manager")
REWARD_MANAGERS.register("naive")(RewardManager)


def build_reward_manager(cfg: Any, tokenizer: Any) -> RewardManager:
    """Build the manager named by ``cfg.reward_model.reward_manager`` from verl's config keys
    ``custom_reward_function.{path,name}``, ``data.reward_fn_key`` and
    ``reward_model.overlong_buffer.{enable,len,penalty_factor}``.

    Raises:
        ConfigError: unknown ``reward_model.reward_manager``.
        RewardError: the custom function cannot be loaded.
    """
    cls = REWARD_MANAGERS.get(cfg.reward_model.reward_manager)
    custom = cfg.custom_reward_function
    ob = cfg.reward_model.overlong_buffer
    overlong = (int(cfg.data.max_response_length), int(ob.len), float(ob.penalty_factor)) if ob.enable else None
    return cls(
        tokenizer, custom_path=custom.path, custom_name=custom.name, reward_fn_key=cfg.data.reward_fn_key,
        overlong=overlong,
    )

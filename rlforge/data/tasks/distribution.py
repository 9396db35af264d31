"""Built-in ``builtin:distribution`` task: match a multimodal reward distribution.

Source: Zhu et al. 2025, "FlowRL: Matching Reward Distributions for LLM Reasoning", the
toy experiment of §5 (reward-maximising GRPO collapses onto one mode, FlowRL covers all).

The prompt is fixed ("Pick a number."); the policy answers with an integer x in
``low..high`` and the reward is ``log p*(x)`` with

    p*(x) ∝ Σ_k w_k · exp(-(x - μ_k)² / width)        on the integers low..high

(default: weights 0.25/0.5/0.25 at 20/50/80, width 10).  An answer that is not an
integer in range gets ``invalid_reward``.  The target travels in each row's
``reward_model.ground_truth`` (as JSON), so the reward rule needs no config.
Use the ``builtin:integers`` tokenizer (every integer one token) and
``data.max_response_length=1`` so the policy's probability of each x is exact.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

from rlforge.data.tasks.registry import BUILTIN_TASKS
from rlforge.errors import ConfigError

DATA_SOURCE = "rlforge/distribution"
PROMPT = "Pick a number."


def target_spec(params: Any) -> dict[str, Any]:
    """The target as a plain dict (``weights``, ``means``, ``width``, ``low``, ``high``, ``invalid_reward``).

    Raises:
        ConfigError: inconsistent ``data.builtin.distribution.*`` values.
    """
    key = "data.builtin.distribution"
    spec = {
        "weights": [float(w) for w in params.weights],
        "means": [float(m) for m in params.means],
        "width": float(params.width),
        "low": int(params.low),
        "high": int(params.high),
        "invalid_reward": float(params.invalid_reward),
    }
    if len(spec["weights"]) != len(spec["means"]) or not spec["weights"]:
        raise ConfigError(f"{key}.weights and {key}.means must be non-empty lists of the same length")
    if min(spec["weights"]) < 0 or sum(spec["weights"]) <= 0:
        raise ConfigError(f"{key}.weights must be non-negative with a positive sum, got {spec['weights']}")
    if spec["width"] <= 0 or spec["high"] < spec["low"]:
        raise ConfigError(f"{key}: need width > 0 and high >= low")
    return spec


def target_probs(spec: dict[str, Any]) -> np.ndarray:
    """p*(x) for x = low..high, float64, summing to 1 (computed in log space)."""
    xs = np.arange(spec["low"], spec["high"] + 1, dtype=np.float64)
    comps = [
        math.log(w) - (xs - mu) ** 2 / spec["width"]
        for w, mu in zip(spec["weights"], spec["means"], strict=True)
        if w > 0
    ]
    logp = np.logaddexp.reduce(np.stack(comps), axis=0)
    logp -= np.logaddexp.reduce(logp)
    return np.exp(logp)


def log_target(spec: dict[str, Any], x: int) -> float:
    """``log p*(x)`` (normalised), or ``invalid_reward`` when x is out of range."""
    if not spec["low"] <= x <= spec["high"]:
        return spec["invalid_reward"]
    return float(np.log(target_probs(spec)[x - spec["low"]]))


@BUILTIN_TASKS.register("distribution")
def generate_distribution(
    *, split: str, size: int, difficulty: int, seed: int, builtin: Any = None
) -> list[dict[str, Any]]:
    """``size`` identical rows (the prompt is fixed); ``difficulty`` and ``seed`` are unused.

    Raises:
        ConfigError: if ``builtin`` (``data.builtin``) is missing or inconsistent.
    """
    if builtin is None:
        raise ConfigError("builtin:distribution needs the data.builtin.distribution settings")
    spec = target_spec(builtin.distribution)
    truth = json.dumps(spec)
    return [
        {
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": PROMPT}],
            "ability": "distribution",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": i},
        }
        for i in range(size)
    ]

"""Rule rewards dispatched by ``data_source`` (verl's ``default_compute_score``).

Every rule has the keyword signature of a custom reward function,
``(data_source, solution_str, ground_truth, extra_info) -> float``, so the reward manager
calls rules and custom functions the same way.  Add a data source with
``@REWARD_RULES.register("my/source")``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from rlforge.errors import RewardError
from rlforge.registry import Registry
from rlforge.rewards import arithmetic, gsm8k
from rlforge.rewards.numeric import canonical_number


class RewardFn(Protocol):
    """A reward function: returns a float, or a dict with ``score`` plus extra logged values."""

    def __call__(
        self, *, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None
    ) -> float | dict[str, Any]: ...


REWARD_RULES: Registry[RewardFn] = Registry("reward rule", "data_source")


@REWARD_RULES.register("openai/gsm8k")
def gsm8k_strict(*, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    """verl's GSM8K rule, strict mode (``#### <number>`` required)."""
    return gsm8k.compute_score(solution_str, ground_truth, method="strict")


@REWARD_RULES.register("rlforge/arithmetic")
def arithmetic_exact(
    *, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> float:
    """Exact match of the response's final integer with the answer (``method='last_int'``).

    The whole-response ``strict`` method gives a small instruct model no reward at all at
    the start (it answers "7 + 4 = 11"), so GRPO would have no signal; the final integer
    must still equal the ground truth exactly.
    """
    return arithmetic.compute_score(solution_str, ground_truth, method="last_int")


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: dict[str, Any] | None = None
) -> float | dict[str, Any]:
    """Score one response with the rule registered for ``data_source``.

    Raises:
        RewardError: if no rule is registered for ``data_source``; the message lists the
            known data sources and points to ``custom_reward_function.path``.
    """
    if data_source not in REWARD_RULES:
        raise RewardError(
            f"no reward rule for data_source {data_source!r}; known data sources: "
            f"{', '.join(REWARD_RULES.names())}. Set custom_reward_function.path (and .name) "
            "to a .py file defining compute_score(data_source, solution_str, ground_truth, extra_info)"
        )
    return REWARD_RULES.get(data_source)(
        data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info
    )


@REWARD_RULES.register("rlforge/distribution")
def distribution_log_target(
    *, data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> float:
    """``log p*(x)`` of the answer x under the target in ``ground_truth`` (JSON, see
    :mod:`rlforge.data.tasks.distribution`); ``invalid_reward`` for a non-integer answer."""
    import json

    from rlforge.data.tasks.distribution import log_target

    spec = json.loads(ground_truth)
    text = solution_str.strip()
    try:
        x = int(text)
    except ValueError:
        return float(spec["invalid_reward"])
    return log_target(spec, x)


ANSWER_RULES: Registry[Callable[[str], str | None]] = Registry("answer extractor", "data_source")
"""The final answer a rule reads from a response, by ``data_source``: validation's ``maj@N``
votes over these (:mod:`rlforge.trainer.val_metrics`) when the reward function returns no ``pred``."""
ANSWER_RULES.register("openai/gsm8k")(lambda text: gsm8k.extract_solution(text, method="strict"))
ANSWER_RULES.register("rlforge/arithmetic")(lambda text: arithmetic.extract_answer(text, method="last_int"))


def extract_answer(data_source: str, solution_str: str) -> str | None:
    """The answer of ``solution_str`` under the rule of ``data_source``, in canonical numeric form
    (``"7.0"`` -> ``"7"``); None when there is no answer or no extractor for that data source."""
    if data_source not in ANSWER_RULES:
        return None
    answer = ANSWER_RULES.get(data_source)(solution_str)
    return None if answer is None else canonical_number(answer)

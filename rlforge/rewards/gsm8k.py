"""GSM8K rule reward, matching verl's ``verl/utils/reward_score/gsm8k.py``.

Reference: Trung et al., "ReFT: Reasoning with Reinforced Fine-Tuning", ACL 2024.

* ``strict``: only the last 300 characters of the response are searched (verl's
  ``_SOLUTION_CLIP_CHARS``); the answer is the LAST match of ``#### <number>`` where the
  number is ``-?[0-9.,]+``; commas (and ``$``) are removed.  As in verl, a ``$`` right after
  ``#### `` stops the match (``"#### $18"`` has no strict answer); the ``$`` removal only
  matters for patterns that could contain it.
* ``flexible``: the last ``-?[0-9.,]+`` in the (clipped) response that is not ``""``/``"."``.

The extracted answer and ``ground_truth`` are compared as numbers when both are numbers
(:func:`rlforge.rewards.numeric.numbers_equal`, exactly by decimal value: ``"72"`` equals ``72.0``,
``"72.0"`` and ``"72.00"``; ``"1000000001"`` does not equal ``"1000000000"``), else as stripped
strings.  Deviations from verl: verl compares strings (``"72" != "72.0"``), so an integer column
stored as float (``7.0``) scores 0 there for every response; and in flexible mode, a response
whose only matches are ``"."`` has no answer (score 0) instead of comparing ``"."`` to the ground truth (same result for
``format_score = 0``); and a strict number followed by an exponent (``"#### 1e999"``) is no answer, where verl reads
its mantissa (``"1"``).
"""

from __future__ import annotations

import re
from typing import Any

from rlforge.rewards.numeric import numbers_equal

SOLUTION_CLIP_CHARS = 300
# possessive, and not followed by an exponent: "#### 1e999" has no strict answer (verl reads it as "1")
_STRICT_RE = re.compile(r"#### (\-?[0-9\.\,]++)(?![eE][+\-]?[0-9])")
_NUMBER_RE = re.compile(r"(\-?[0-9\.\,]+)")
_INVALID = ("", ".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The final answer in ``solution_str`` per ``method`` (``strict`` | ``flexible``), or None.

    Raises:
        ValueError: unknown ``method``.
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    text = solution_str[-SOLUTION_CLIP_CHARS:]
    if method == "strict":
        matches = _STRICT_RE.findall(text)
        return matches[-1].replace(",", "").replace("$", "") if matches else None
    for candidate in reversed(_NUMBER_RE.findall(text)):
        if candidate not in _INVALID:
            return candidate
    return None


def compute_score(
    solution_str: str,
    ground_truth: Any,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` if the extracted answer equals ``ground_truth`` (as numbers when both are, see
    :func:`~rlforge.rewards.numeric.numbers_equal`), ``format_score`` if an answer was found but
    differs, and 0.0 if no answer was found.
    """
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return float(score) if numbers_equal(answer, ground_truth) else float(format_score)

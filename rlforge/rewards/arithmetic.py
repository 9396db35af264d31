"""Exact-match reward of the built-in ``builtin:arithmetic`` task (``rlforge/arithmetic``).

The prompt asks for "only the number", so by default (``method='strict'``) the WHOLE
response, after stripping surrounding whitespace and trailing punctuation (``. ! ,``
and the like), must be the integer: ``"12"``, ``" 12.\n"`` and ``"12!"`` score 1.0 for
ground truth ``"12"``; ``"The answer is 12"`` and ``"12 or 13"`` score 0.0.  Leading ``+``
and zeros are not accepted (``"012"`` is wrong).  ``method='last_int'`` is the lenient
variant: the last integer in the response is compared (``"7 + 5 = 12"`` scores 1.0).
A numeric ground truth is compared in its canonical form (``12.0``, ``"12.0"`` -> ``"12"``,
:func:`rlforge.rewards.numeric.canonical_number`); the response's integer is not (``"012"`` stays wrong).
"""

from __future__ import annotations

import re
from typing import Any

from rlforge.rewards.numeric import canonical_number

_INT_RE = re.compile(r"-?\d+")
_TRAILING = " \t\r\n.!?,;:。"


def extract_answer(solution_str: str, method: str = "strict") -> str | None:
    """The answer string of the response per ``method`` (``strict`` | ``last_int``), or None.

    Raises:
        ValueError: unknown ``method``.
    """
    if method == "strict":
        text = solution_str.strip().rstrip(_TRAILING)
        return text if re.fullmatch(r"-?\d+", text) else None
    if method == "last_int":
        matches = _INT_RE.findall(solution_str)
        return matches[-1] if matches else None
    raise ValueError(f"method must be 'strict' or 'last_int', got {method!r}")


def compute_score(solution_str: str, ground_truth: Any, method: str = "strict") -> float:
    """1.0 if the response's answer equals ``ground_truth`` (its canonical string), else 0.0."""
    answer = extract_answer(solution_str, method)
    return 1.0 if answer is not None and answer == canonical_number(ground_truth) else 0.0

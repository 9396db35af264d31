"""Numeric ground truths: ``7``, ``7.0``, ``"7"``, ``"7.0"`` and ``numpy.float64(7.0)`` are one number.

A parquet column of integers with one missing value is written by pandas as ``float64``, so a
ground truth ``7`` arrives as ``7.0`` (and rlforge's loader turns it into the string ``"7.0"``).
Compared as strings, the GSM8K answer ``#### 7`` never matches and every reward is silently 0.
The math rules therefore compare numbers as numbers (:func:`numbers_equal`), and the reward
manager warns once when a batch scores all zeros while its ground truths look like floats
(:func:`looks_like_float_column`).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Sequence
from typing import Any

_NUMBER_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INTEGRAL_FLOAT_RE = re.compile(r"[+-]?\d+\.0*")


def as_number(x: Any) -> float | None:
    """``x`` as a float when it is a real number (Python or numpy scalar, not bool) or a string
    that is one number (commas allowed as thousands separators, surrounding spaces ignored); else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, numbers.Real) or (hasattr(x, "item") and getattr(x, "ndim", 1) == 0 and not isinstance(x, str)):
        try:
            v = float(x)
        except (TypeError, ValueError):
            return None
        return v if math.isfinite(v) else None
    if isinstance(x, bytes):
        x = x.decode(errors="replace")
    if isinstance(x, str):
        text = x.strip().replace(",", "")
        if _NUMBER_RE.fullmatch(text):
            return float(text)
    return None


def canonical_number(x: Any) -> str:
    """``x`` as the string the rules compare: an integral number is written without a decimal part
    (``7.0`` -> ``"7"``, ``"7.00"`` -> ``"7"``), another number as Python's shortest float repr
    (``2.50`` -> ``"2.5"``); anything that is not a number is ``str(x).strip()``."""
    v = as_number(x)
    if v is None:
        return str(x).strip()
    if v.is_integer() and abs(v) < 2**63:
        return str(int(v))
    return repr(v)


def numbers_equal(answer: Any, ground_truth: Any) -> bool:
    """True when both are numbers (see :func:`as_number`) of equal value (relative tolerance 1e-9,
    so ``0.1 + 0.2`` written out equals ``0.3``), or, when either is not a number, their stripped
    strings are equal."""
    a, g = as_number(answer), as_number(ground_truth)
    if a is None or g is None:
        return str(answer).strip() == str(ground_truth).strip()
    return a == g or math.isclose(a, g, rel_tol=1e-9, abs_tol=0.0)


def looks_like_float_column(ground_truths: Sequence[Any]) -> bool:
    """True when every ground truth is a float (Python or numpy) or a string such as ``"7.0"``:
    the signature of an integer column that pandas stored as ``float64``."""
    if len(ground_truths) == 0:
        return False
    for g in ground_truths:
        if isinstance(g, str):
            if not _INTEGRAL_FLOAT_RE.fullmatch(g.strip()):
                return False
        elif not (isinstance(g, float) or type(g).__name__.startswith("float")):
            return False
    return True

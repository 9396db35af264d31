"""Numeric ground truths: ``7``, ``7.0``, ``"7"``, ``"7.0"`` and ``numpy.float64(7.0)`` are one number.

A parquet column of integers with one missing value is written by pandas as ``float64``, so a
ground truth ``7`` arrives as ``7.0`` (and rlforge's loader turns it into the string ``"7.0"``).
Compared as strings, the GSM8K answer ``#### 7`` never matches and every reward is silently 0.
The math rules therefore compare numbers as numbers (:func:`numbers_equal`), and the reward
manager warns once when a batch scores all zeros while its ground truths look like floats
(:func:`looks_like_float_column`).

Numbers are compared EXACTLY, by their decimal value (:class:`decimal.Decimal`), never through a
binary float: ``"1.50"`` equals ``"1.5"`` and ``1000000001`` does not equal ``1000000000`` (a
relative tolerance of 1e-9 used to make them equal), and ``2**60 + 1`` keeps its last digit (a
float rounds it to ``2**60``).  A float value stands for its shortest decimal repr: ``0.1``
(Python or ``numpy.float64``) is ``0.1``, and a ``numpy.float32`` is read in float32's own
shortest repr (``np.float32(0.1)`` is ``0.1``, not ``0.10000000149011612``).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np

_NUMBER_RE = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_INTEGRAL_FLOAT_RE = re.compile(r"[+-]?\d+\.0*")
MAX_EXPONENT = 4000
"""Numbers written with a larger decimal exponent (``1e5000``) are not numbers here (compared as
strings): Python will not print an integer of more than 4300 digits, and ``1e999999999`` as an
integer would not fit in memory."""


def float_text(x: Any) -> str:
    """The shortest decimal text that reads back as the same float, in the float's own width:
    ``np.float32(0.1)`` -> ``"0.1"`` (not ``"0.10000000149011612"``), ``0.1`` -> ``"0.1"``."""
    if isinstance(x, np.floating) and not isinstance(x, np.float64):
        return np.format_float_positional(x, unique=True, trim="-")
    return repr(float(x))


def as_decimal(x: Any) -> Decimal | None:
    """``x`` as an exact :class:`~decimal.Decimal` when it is a real number (Python, numpy or 0-d
    torch int or float, not bool; a float by :func:`float_text`) or a string that is one number
    (commas allowed as thousands separators, surrounding spaces ignored, ``"72."`` and ``".5"``
    accepted); else None (also for NaN, infinities and exponents beyond :data:`MAX_EXPONENT`)."""
    if isinstance(x, bool | np.bool_):
        return None
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0 and not isinstance(x, np.generic):
        x = x.item()  # a 0-d tensor or array
    if isinstance(x, bytes):
        x = x.decode(errors="replace")
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        d = Decimal(int(x))
    elif isinstance(x, Decimal):
        d = x
    elif isinstance(x, numbers.Real):
        d = Decimal(float_text(x))
    elif isinstance(x, str) and _NUMBER_RE.fullmatch(text := x.strip().replace(",", "")):
        d = Decimal(text)
    else:
        return None
    return d if d.is_finite() and abs(d.adjusted()) <= MAX_EXPONENT else None


def _is_integral(d: Decimal) -> bool:
    _, digits, exponent = d.as_tuple()
    assert isinstance(exponent, int)  # finite: as_decimal returns no NaN/inf
    return exponent >= 0 or not any(digits[exponent:])


def canonical_number(x: Any) -> str:
    """``x`` as the string the rules compare: an integral number is written without a decimal part
    (``7.0`` -> ``"7"``, ``"7.00"`` -> ``"7"``, ``2**60 + 1`` exactly), another number in plain
    decimal notation without trailing zeros (``2.50`` -> ``"2.5"``, ``"1e-7"`` -> ``"0.0000001"``);
    anything that is not a number is ``str(x).strip()``."""
    d = as_decimal(x)
    if d is None:
        return str(x).strip()
    if _is_integral(d):
        return str(int(d))
    return format(d, "f").rstrip("0")


def numbers_equal(answer: Any, ground_truth: Any) -> bool:
    """True when both are numbers (see :func:`as_decimal`) of exactly equal decimal value
    (``"1.50"`` == ``1.5``, ``"1,000"`` == ``1000``, ``1000000001`` != ``1000000000``), or, when
    either is not a number, their stripped strings are equal."""
    a, g = as_decimal(answer), as_decimal(ground_truth)
    if a is None or g is None:
        return str(answer).strip() == str(ground_truth).strip()
    return a == g


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

"""Built-in ``builtin:arithmetic`` task: short integer arithmetic questions.

The prompt is a single user message such as ``"What is 7 + 5? Answer with only the
number."``; the ground truth is the exact integer result as a string (``"12"``).  Prompts and
answers are kept short on purpose: the default job trains a 135M model on a 2-core CPU.
Rows carry ``data_source = "rlforge/arithmetic"``, scored by
:func:`rlforge.rewards.arithmetic.compute_score`.

Difficulty levels (``data.builtin.difficulty``: one level, or a list of levels to mix):

====  =============================================================
1     ``a + b``, single-digit operands (0-9)
2     ``a + b`` or ``a - b``, two-digit operands (10-99); results may be negative
3     as 2, plus ``a * b`` with a two-digit times a one-digit factor (2-9)
4     three operands, ``+ - *`` with the usual precedence, two-digit operands
5     three operands, ``+ - *``, three-digit operands, two-digit factors
====  =============================================================

A list of levels, e.g. ``[1, 2]``, mixes them in equal shares: row ``i`` has level
``levels[i % len(levels)]`` (so 64 validation rows of ``[1, 2]`` are 32 of each), and the
training set is shuffled by the loader as usual.

Held-out validation problems: a problem (its expression, e.g. ``"7 + 5"``) belongs to the
validation split when the SHA-256 hash of ``"rlforge/arithmetic:<expression>"`` is 0 modulo
:data:`HOLD_OUT_EVERY` (8), and to the training split otherwise.  Each split draws only its own
problems, so no validation prompt is ever a training prompt, whatever the sizes, seed or levels
(at level 1, 17 of the 100 sums are held out; a validation set larger than that repeats them).

Determinism: problems come from :class:`random.Random` seeded with a string made of the
task name, split, seed and difficulty (string seeds are hashed with SHA-512, so the stream
is the same in every process).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rlforge.data.tasks.registry import BUILTIN_TASKS
from rlforge.errors import ConfigError

DATA_SOURCE = "rlforge/arithmetic"
PROMPT_TEMPLATE = "What is {expr}? Answer with only the number."
HOLD_OUT_EVERY = 8
"""One problem in this many (by hash of its expression) is a validation problem, never a training one."""
_MAX_DRAWS = 10_000  # draws per row before giving up (a level whose split holds no problem)


@dataclass(frozen=True)
class _Level:
    num_operands: int
    ops: tuple[str, ...]
    digits: int  # operand size for + and -
    mul_digits: int  # size of the right factor of *


LEVELS: dict[int, _Level] = {
    1: _Level(2, ("+",), 1, 1),
    2: _Level(2, ("+", "-"), 2, 1),
    3: _Level(2, ("+", "-", "*"), 2, 1),
    4: _Level(3, ("+", "-", "*"), 2, 1),
    5: _Level(3, ("+", "-", "*"), 3, 2),
}


def _operand(rng: random.Random, digits: int) -> int:
    if digits == 1:
        return rng.randint(0, 9)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)


def evaluate(operands: list[int], ops: list[str]) -> int:
    """Exact value of ``operands[0] ops[0] operands[1] ...`` with ``*`` before ``+``/``-``."""
    terms = [operands[0]]
    signs = [1]
    for op, x in zip(ops, operands[1:], strict=True):
        if op == "*":
            terms[-1] *= x
        else:
            terms.append(x)
            signs.append(1 if op == "+" else -1)
    return sum(s * t for s, t in zip(signs, terms, strict=True))


def make_problem(rng: random.Random, difficulty: int) -> tuple[str, int]:
    """Draw one problem; returns ``(expression, exact integer answer)``."""
    level = LEVELS[difficulty]
    ops = [rng.choice(level.ops) for _ in range(level.num_operands - 1)]
    operands = [_operand(rng, level.digits)]
    for op in ops:
        operands.append(
            rng.randint(2, 10**level.mul_digits - 1) if op == "*" else _operand(rng, level.digits)
        )
    expr = str(operands[0]) + "".join(f" {op} {x}" for op, x in zip(ops, operands[1:], strict=True))
    return expr, evaluate(operands, ops)


def is_held_out(expr: str) -> bool:
    """True when the problem ``expr`` belongs to the validation split (see the module docstring)."""
    digest = hashlib.sha256(f"{DATA_SOURCE}:{expr}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % HOLD_OUT_EVERY == 0


def difficulty_levels(difficulty: int | Sequence[int]) -> list[int]:
    """``data.builtin.difficulty`` as a list of levels (one level, or a non-empty list of them).

    Raises:
        ConfigError: a value that is not a known level, or an empty list.
    """
    levels = [difficulty] if isinstance(difficulty, int) else list(difficulty)
    bad = [d for d in levels if isinstance(d, bool) or not isinstance(d, int) or d not in LEVELS]
    if not levels or bad:
        raise ConfigError(
            f"data.builtin.difficulty={difficulty!r} is not a level of builtin:arithmetic or a non-empty list of "
            f"levels; choose from {sorted(LEVELS)} (e.g. 2, or [1, 2] to mix them)"
        )
    return levels


def _draw(rng: random.Random, level: int, held_out: bool) -> tuple[str, int]:
    """A problem of ``level`` from the validation (``held_out``) or the training problems."""
    for _ in range(_MAX_DRAWS):
        expr, answer = make_problem(rng, level)
        if is_held_out(expr) == held_out:
            return expr, answer
    raise RuntimeError(f"builtin:arithmetic level {level} has no {'validation' if held_out else 'training'} problems")


@BUILTIN_TASKS.register("arithmetic")
def generate_arithmetic(
    *, split: str, size: int, difficulty: int | Sequence[int], seed: int, builtin: Any = None
) -> list[dict[str, Any]]:
    """Generate ``size`` verl-format arithmetic rows for ``split`` (``"val"`` draws the held-out
    problems, any other split the rest); ``difficulty`` is a level or a list of levels to mix.

    Raises:
        ConfigError: if ``difficulty`` is not a known level or list of levels
            (``data.builtin.difficulty``) or ``size`` is negative.
    """
    levels = difficulty_levels(difficulty)
    if size < 0:
        raise ConfigError(f"builtin:arithmetic size for split {split!r} must be >= 0, got {size}")
    tag = ",".join(map(str, levels))
    rng = random.Random(f"{DATA_SOURCE}:{split}:{seed}:{tag}")
    rows = []
    for index in range(size):
        level = levels[index % len(levels)]
        expr, answer = _draw(rng, level, held_out=split == "val")
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": PROMPT_TEMPLATE.format(expr=expr)}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"split": split, "index": index, "difficulty": level, "expression": expr},
            }
        )
    return rows

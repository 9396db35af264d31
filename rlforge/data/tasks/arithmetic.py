"""Built-in ``builtin:arithmetic`` task: short integer arithmetic questions.

The prompt is a single user message such as ``"What is 7 + 5? Answer with only the
number."``; the ground truth is the exact integer result as a string (``"12"``).  Prompts and
answers are kept short on purpose: the default job trains a 135M model on a 2-core CPU.
Rows carry ``data_source = "rlforge/arithmetic"``, scored by
:func:`rlforge.rewards.arithmetic.compute_score`.

Difficulty levels (``data.builtin.difficulty``):

====  =============================================================
1     ``a + b``, single-digit operands (0-9)
2     ``a + b`` or ``a - b``, two-digit operands (10-99); results may be negative
3     as 2, plus ``a * b`` with a two-digit times a one-digit factor (2-9)
4     three operands, ``+ - *`` with the usual precedence, two-digit operands
5     three operands, ``+ - *``, three-digit operands, two-digit factors
====  =============================================================

Determinism: problems come from :class:`random.Random` seeded with a string made of the
task name, split, seed and difficulty (string seeds are hashed with SHA-512, so the stream
is the same in every process).  ``train`` and ``val`` therefore draw different streams;
at difficulty 1 there are only 100 distinct problems, so the splits can share problems.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from rlforge.data.tasks.registry import BUILTIN_TASKS
from rlforge.errors import ConfigError

DATA_SOURCE = "rlforge/arithmetic"
PROMPT_TEMPLATE = "What is {expr}? Answer with only the number."


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


@BUILTIN_TASKS.register("arithmetic")
def generate_arithmetic(
    *, split: str, size: int, difficulty: int, seed: int, builtin: Any = None
) -> list[dict[str, Any]]:
    """Generate ``size`` verl-format arithmetic rows for ``split``.

    Raises:
        ConfigError: if ``difficulty`` is not a known level (``data.builtin.difficulty``) or
            ``size`` is negative.
    """
    if difficulty not in LEVELS:
        raise ConfigError(
            f"data.builtin.difficulty={difficulty!r} is not a level of builtin:arithmetic; "
            f"choose one of {sorted(LEVELS)}"
        )
    if size < 0:
        raise ConfigError(f"builtin:arithmetic size for split {split!r} must be >= 0, got {size}")
    rng = random.Random(f"{DATA_SOURCE}:{split}:{seed}:{difficulty}")
    rows = []
    for index in range(size):
        expr, answer = make_problem(rng, difficulty)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": PROMPT_TEMPLATE.format(expr=expr)}],
                "ability": "arithmetic",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"split": split, "index": index, "difficulty": difficulty, "expression": expr},
            }
        )
    return rows

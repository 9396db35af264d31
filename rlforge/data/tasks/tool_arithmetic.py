"""Built-in ``builtin:tool_arithmetic``: multiplying long numbers, easy with the calculator tool.

Each row asks for ``a * b`` where both factors have ``difficulty + 1`` digits (level 1: two-digit
factors ... level 5: six-digit factors), too long to multiply in the head for a small model.  The
system message describes the ``calculator`` tool in the Hermes format (``<tool_call>{json}</tool_call>``),
since not every chat template renders tool schemas (SmolLM2's does not), and one worked conversation
(:data:`EXAMPLE`: a question, the tool call, the tool's result, the answer) comes before the question.  Run it with
``rollout.multi_turn.enable=true`` and ``rollout.multi_turn.tool_config_path=builtin:calculator``;
without them it is the same task without tools, for the comparison.

Rows carry ``data_source = "rlforge/arithmetic"`` (scored by the last integer of the model's own
tokens: the answer must be restated after the tool's result) and ``reward_model.ground_truth`` =
the exact product.  Validation problems are held out by hash as in ``builtin:arithmetic``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import Any

from rlforge.data.tasks.arithmetic import DATA_SOURCE, difficulty_levels
from rlforge.data.tasks.registry import BUILTIN_TASKS

SYSTEM = (
    "You can use a calculator. To call it, write exactly\n"
    '<tool_call>{"name": "calculator", "arguments": {"expression": "12 * 34"}}</tool_call>\n'
    "and stop; the result comes back in the next message. Then answer with only the number."
)
PROMPT = "What is {a} * {b}?"
EXAMPLE = [
    {"role": "user", "content": "What is 23 * 41?"},
    {"role": "assistant", "content": '<tool_call>{"name": "calculator", "arguments": {"expression": "23 * 41"}}</tool_call>'},
    {"role": "tool", "content": "943"},
    {"role": "assistant", "content": "943"},
]
"""One worked conversation before the question: without it SmolLM2-135M-Instruct wrote no tool call in 16
samples at T = 1; with it, one in eight (CPU probe, 2026-12-01), enough for RL to find the tool."""
HOLD_OUT_EVERY = 8


def _held_out(a: int, b: int) -> bool:
    h = hashlib.sha256(f"rlforge/tool_arithmetic:{a}*{b}".encode()).digest()
    return int.from_bytes(h[:8], "big") % HOLD_OUT_EVERY == 0


@BUILTIN_TASKS.register("tool_arithmetic")
def generate_tool_arithmetic(
    *, split: str, size: int, difficulty: int | Sequence[int], seed: int, builtin: Any = None
) -> list[dict[str, Any]]:
    """``size`` verl-format rows for ``split`` (``val`` = the held-out problems).

    Raises:
        ConfigError: ``difficulty`` is not a level 1-5 or a non-empty list of levels.
    """
    levels = difficulty_levels(difficulty)
    rng = random.Random(f"tool_arithmetic:{split}:{seed}:{levels}")
    rows = []
    for i in range(size):
        d = levels[i % len(levels)] + 1
        while True:
            a, b = (rng.randint(10 ** (d - 1), 10**d - 1) for _ in range(2))
            if _held_out(a, b) == (split == "val"):
                break
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "system", "content": SYSTEM}, *EXAMPLE,
                       {"role": "user", "content": PROMPT.format(a=a, b=b)}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a * b)},
            "extra_info": {"split": split, "index": i, "tools_kwargs": {}},
        })
    return rows

"""FlowRL lives in its policy-loss registration (``rlforge/algorithms/flowrl.py`` and the hooks it
registers, :mod:`rlforge.algorithms.loss_hooks`): the trainer, the roles and the engines never name
it, so they never branch on it (the house rule: the caller of a registry does not branch on the key)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GENERIC = ["rlforge/trainer", "rlforge/roles", "rlforge/engine"]


def mentions(folder: str, word: str = "flowrl") -> list[str]:
    """``path:line`` of every case-insensitive occurrence of ``word`` in the Python files of ``folder``."""
    pattern = re.compile(re.escape(word), re.IGNORECASE)
    out = []
    for path in sorted((REPO / folder).rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if pattern.search(line):
                out.append(f"{path.relative_to(REPO).as_posix()}:{i}: {line.strip()}")
    return out


def test_the_search_finds_a_mention() -> None:
    assert mentions("rlforge/algorithms")  # the registration itself names it


def test_no_flowrl_in_trainer_roles_engines() -> None:
    found = [m for folder in GENERIC for m in mentions(folder)]
    assert not found, "FlowRL named in generic code (move it into its policy-loss hooks):\n" + "\n".join(found)

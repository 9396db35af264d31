"""No function over :data:`MAX_LINES` lines (the house rule, docs/architecture.md) in the checked folders.

A function's length is its ``def`` line through its last line (``ast``'s ``end_lineno``), docstring,
comments and blank lines included, decorators not; a nested function counts on its own and inside
its parent.  :data:`KNOWN_LONG` lists the functions that are still over the limit, with their
length now: such a function may not grow, and its entry must go once it is split.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

MAX_LINES = 80
REPO = Path(__file__).resolve().parents[1]

CHECKED = ["rlforge/rollout/native", "rlforge/trainer"]
"""Folders under the limit."""

KNOWN_LONG: dict[str, int] = {}
"""``path::qualified name`` -> its length now, for functions over the limit."""


def long_functions(source: str, limit: int = MAX_LINES) -> dict[str, int]:
    """Qualified name -> length of every function in ``source`` longer than ``limit`` lines."""
    found: dict[str, int] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                length = child.end_lineno - child.lineno + 1
                if length > limit:
                    found[prefix + child.name] = length
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)

    walk(ast.parse(source), "")
    return found


def _over_limit(folder: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for path in sorted((REPO / folder).rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        for name, length in long_functions(path.read_text(encoding="utf-8")).items():
            out[f"{rel}::{name}"] = length
    return out


def test_long_functions_are_found() -> None:
    body = "\n".join(f"x{i} = {i}" for i in range(79))
    method = f"def long(self):\n{textwrap.indent(body, '    ')}\n    def inner():\n        pass\n"
    source = f"def ok():\n{textwrap.indent(body, '    ')}\n\nclass C:\n{textwrap.indent(method, '    ')}"
    assert long_functions(source) == {"C.long": 82}  # ok(): 80 lines, at the limit


@pytest.mark.parametrize("folder", CHECKED)
def test_no_function_over_the_limit(folder: str) -> None:
    found = _over_limit(folder)
    known = {k: v for k, v in KNOWN_LONG.items() if k.startswith(folder + "/")}
    new = {k: v for k, v in found.items() if k not in known}
    grown = {k: (v, known[k]) for k, v in found.items() if k in known and v > known[k]}
    fixed = sorted(k for k in known if k not in found)
    problems = [f"{k}: {v} lines (limit {MAX_LINES})" for k, v in sorted(new.items())]
    problems += [f"{k}: grew to {v} lines (listed at {was}; split it instead)" for k, (v, was) in sorted(grown.items())]
    problems += [f"{k}: now within {MAX_LINES} lines; remove it from KNOWN_LONG" for k in fixed]
    assert not problems, "functions over the length limit:\n" + "\n".join(problems)

"""Registry of built-in generated tasks, selected by ``data.train_files: builtin:<name>``.

Every task is a function with the keyword signature
``(split: str, size: int, difficulty: int | list[int], seed: int, builtin: Any = None) -> list[dict]``
(``difficulty`` is ``data.builtin.difficulty``: one level or a list of levels; ``builtin`` is the whole ``data.builtin`` config, for task-specific settings) returning verl-format
rows (``data_source``, ``prompt``, ``ability``, ``reward_model``, ``extra_info``).  It must be
deterministic given its arguments and must derive a different stream of problems for each
``split``.
"""

from __future__ import annotations

from typing import Any, Protocol

from rlforge.registry import Registry


class BuiltinTask(Protocol):
    """Generator of verl-format rows for one split of a built-in task."""

    def __call__(
        self, *, split: str, size: int, difficulty: int | list[int], seed: int, builtin: Any = None
    ) -> list[dict[str, Any]]: ...


BUILTIN_TASKS: Registry[BuiltinTask] = Registry("built-in task", "data.train_files (builtin:<name>)")

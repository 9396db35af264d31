"""Built-in generated tasks (``builtin:<name>`` in ``data.train_files``/``data.val_files``)."""

from rlforge.data.tasks import (
    arithmetic,  # noqa: F401  (registers builtin:arithmetic)
    distribution,  # noqa: F401  (registers builtin:distribution)
    tool_arithmetic,  # noqa: F401  (registers builtin:tool_arithmetic)
)
from rlforge.data.tasks.registry import BUILTIN_TASKS, BuiltinTask

__all__ = ["BUILTIN_TASKS", "BuiltinTask"]

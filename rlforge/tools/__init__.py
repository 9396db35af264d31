"""Tools the model can call in a multi-turn rollout (``rollout.multi_turn.tool_config_path``).

:class:`BaseTool` has verl's ``create / execute / calc_reward / release`` shape; classes register
in :data:`TOOLS`.  Shipped: ``calculator`` (:mod:`.calculator`), ``python_executor`` (a
sandboxed subprocess, :mod:`.python_executor`) and ``gsm8k`` (:mod:`.gsm8k`, also under verl's
class path ``verl.tools.gsm8k_tool.Gsm8kTool``).  :func:`load_tools` reads verl's tool config YAML.
"""

from rlforge.tools import calculator as _calculator  # noqa: F401  (registers)
from rlforge.tools import gsm8k as _gsm8k  # noqa: F401
from rlforge.tools import python_executor as _python_executor  # noqa: F401
from rlforge.tools.base import BaseTool, ToolError, ToolResponse
from rlforge.tools.registry import TOOLS, load_tools
from rlforge.tools.schema import ToolSchema, parse_tool_schema

__all__ = ["TOOLS", "BaseTool", "ToolError", "ToolResponse", "ToolSchema", "load_tools", "parse_tool_schema"]

"""Tool calls in the text of one model turn, Hermes format (Qwen2.5/Qwen3/Hermes chat templates).

A call is ``<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>``;
``arguments`` may also be a JSON string holding the object.  Each ``<tool_call>`` block becomes a
:class:`ToolCall` or, when it does not parse, a :class:`ToolCallError` whose ``message`` is the
text the model reads back (verl drops such calls silently; here the model is told).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(" + re.escape(CLOSE) + r"|$)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: the function ``name`` and its ``arguments`` mapping."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallError:
    """A ``<tool_call>`` block that does not parse; ``message`` says why (shown to the model)."""

    message: str


def parse_hermes(text: str) -> list[ToolCall | ToolCallError]:
    """Every ``<tool_call>`` block of ``text``, in order (empty when there is none).

    A block that is not closed, not JSON, not an object, has no string ``name``, or has ``arguments``
    that are not an object (or a JSON string of one) is a :class:`ToolCallError`.
    """
    out: list[ToolCall | ToolCallError] = []
    for m in _BLOCK.finditer(text):
        body, closed = m.group(1).strip(), bool(m.group(2))
        if not closed:
            out.append(ToolCallError(f"error: the tool call is not closed with {CLOSE}"))
            continue
        try:
            obj = json.loads(body)
        except json.JSONDecodeError as e:
            out.append(ToolCallError(f"error: the tool call is not valid JSON ({e.msg} at character {e.pos})"))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            out.append(ToolCallError('error: a tool call must be a JSON object {"name": ..., "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                args = None
        if not isinstance(args, dict):
            out.append(ToolCallError(f"error: the arguments of {obj['name']!r} must be a JSON object"))
            continue
        out.append(ToolCall(obj["name"], args))
    return out

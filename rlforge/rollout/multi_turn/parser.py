"""Tool calls in the text of one model turn, Hermes format (Qwen2.5/Qwen3/Hermes chat templates).

A call is ``<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>``;
``arguments`` may also be a JSON string holding the object.  Each ``<tool_call>`` block becomes a
:class:`ToolCall` or, when it does not parse, a :class:`ToolCallError` whose ``message`` is the
text the model reads back (verl drops such calls silently; here the model is told).

Text is made safe to tokenize (:func:`clean_text`) before it is parsed, and so are the names and every
string in the arguments (``json.loads`` turns the escape ``"\\ud800"`` into a lone surrogate).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(" + re.escape(CLOSE) + r"|$)", re.DOTALL)
_SURROGATE = re.compile("[\ud800-\udfff]")
_TOO_DEEP = "error: the tool call's JSON is nested too deeply"


def clean_text(text: str | bytes) -> str:
    """``text`` as valid Unicode a tokenizer accepts: bytes decoded as UTF-8, every undecodable byte and
    every lone surrogate (``"\\ud800"``) replaced by U+FFFD.  Valid text comes back unchanged."""
    if isinstance(text, bytes | bytearray):
        return bytes(text).decode("utf-8", "replace")
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)


def _clean(value: Any) -> Any:
    """``value`` (parsed JSON) with every string, keys included, passed through :func:`clean_text`."""
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


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

    A block that is not closed, not JSON (or nested too deeply for ``json``), not an object, has no string ``name``, or has ``arguments``
    that are not an object (or a JSON string of one) is a :class:`ToolCallError`.
    """
    out: list[ToolCall | ToolCallError] = []
    for m in _BLOCK.finditer(clean_text(text)):
        body, closed = m.group(1).strip(), bool(m.group(2))
        if not closed:
            out.append(ToolCallError(f"error: the tool call is not closed with {CLOSE}"))
            continue
        try:
            obj = _clean(json.loads(body))
        except json.JSONDecodeError as e:
            out.append(ToolCallError(f"error: the tool call is not valid JSON ({e.msg} at character {e.pos})"))
            continue
        except RecursionError:
            out.append(ToolCallError(_TOO_DEEP))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            out.append(ToolCallError('error: a tool call must be a JSON object {"name": ..., "arguments": {...}}'))
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            try:
                args = _clean(json.loads(args)) if args.strip() else {}
            except (json.JSONDecodeError, RecursionError):
                args = None
        if not isinstance(args, dict):
            out.append(ToolCallError(f"error: the arguments of {obj['name']!r} must be a JSON object"))
            continue
        out.append(ToolCall(obj["name"], args))
    return out

"""OpenAI function-format tool schemas, as verl's tool config YAML writes them.

A schema is ``{"type": "function", "function": {"name", "description", "parameters"}}`` where
``parameters`` is a JSON-schema object (``{"type": "object", "properties": {...}, "required": [...]}``).
:func:`parse_tool_schema` checks that shape and returns a :class:`ToolSchema`; anything else is a
:class:`ValueError` naming the sub-key, which the config loader turns into one error naming the file
and the key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}$")


@dataclass(frozen=True)
class ToolSchema:
    """One tool's OpenAI function schema.

    Attributes:
        name: the function name the model calls (``<tool_call>{"name": ...}``).
        description: free text shown to the model.
        parameters: the JSON-schema object of the arguments (``properties``, ``required``).
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    @property
    def required(self) -> list[str]:
        return list(self.parameters.get("required", []) or [])

    def to_openai(self) -> dict[str, Any]:
        """The schema as a plain dict, for ``tokenizer.apply_chat_template(tools=[...])``."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


def parse_tool_schema(raw: Any) -> ToolSchema:
    """Check ``raw`` (a mapping in OpenAI function format) and return a :class:`ToolSchema`.

    Raises:
        ValueError: ``raw`` is not a mapping, ``type`` is not ``function``, ``function.name`` is
            missing or not an identifier-like string, or ``function.parameters`` is not a
            JSON-schema object (``type: object``, ``properties`` a mapping, ``required`` a list of
            names of ``properties``).  The message starts with the offending sub-key.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"must be a mapping in OpenAI function format, got {type(raw).__name__}")
    if raw.get("type", "function") != "function":
        raise ValueError(f"type: must be 'function', got {raw.get('type')!r}")
    fn = raw.get("function")
    if not isinstance(fn, dict):
        raise ValueError("function: must be a mapping with name, description and parameters")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"function.name: must be a name of letters, digits, '_', '.', '-' (<= 64), got {name!r}")
    desc = fn.get("description", "")
    if not isinstance(desc, str):
        raise ValueError(f"function.description: must be a string, got {type(desc).__name__}")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict):
        raise ValueError(f"function.parameters: must be a JSON-schema object, got {type(params).__name__}")
    if params.get("type", "object") != "object":
        raise ValueError(f"function.parameters.type: must be 'object', got {params.get('type')!r}")
    props = params.get("properties", {})
    if not isinstance(props, dict):
        raise ValueError(f"function.parameters.properties: must be a mapping, got {type(props).__name__}")
    for pname, p in props.items():
        if not isinstance(p, dict):
            raise ValueError(f"function.parameters.properties.{pname}: must be a mapping, got {type(p).__name__}")
    req = params.get("required", [])
    if not isinstance(req, list) or any(not isinstance(r, str) for r in req):
        raise ValueError(f"function.parameters.required: must be a list of names, got {req!r}")
    missing = [r for r in req if r not in props]
    if missing:
        raise ValueError(f"function.parameters.required: {missing} are not in properties")
    return ToolSchema(name, desc, {**params, "type": "object", "properties": dict(props)})

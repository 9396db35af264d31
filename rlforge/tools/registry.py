"""The tool class registry and verl's tool config YAML loader.

``rollout.multi_turn.tool_config_path`` names a YAML file in verl's format::

    tools:
      - class_name: verl.tools.gsm8k_tool.Gsm8kTool     # or rlforge's name: gsm8k
        config: {type: native}
        tool_schema:
          type: function
          function: {name: calc_gsm8k_reward, description: ..., parameters: {...}}

``class_name`` is looked up in :data:`TOOLS` (rlforge's names and the verl class paths of the
tools that ship here); any other dotted path is imported, so a user's own class loads when it is
importable and subclasses :class:`~rlforge.tools.base.BaseTool` (or has its methods).
Every mistake is one :class:`~rlforge.errors.ConfigError` naming the file and the key
(``tools[1].tool_schema: function.name: ...``), raised before any model loads.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

import yaml

from rlforge.errors import ConfigError
from rlforge.registry import Registry
from rlforge.tools.base import BaseTool
from rlforge.tools.schema import parse_tool_schema

TOOLS: Registry[type[BaseTool]] = Registry("tool class", "rollout.multi_turn.tool_config_path: tools[].class_name")
"""Tool classes by name: ``calculator``, ``python_executor``, ``gsm8k`` and their aliases."""

_METHODS = ("create", "execute", "calc_reward", "release")


VERL_TOOLS_NOT_HERE = {
    "verl.tools.geo3k_tool.Geo3kTool": "verl's tool for geometry problems with images (multi-modal data is not "
                                       "supported in this build)",
    "verl.tools.image_zoom_in_tool.ImageZoomInTool": "verl's image tool (multi-modal data is not supported in this "
                                                     "build)",
    "verl.tools.search_tool.SearchTool": "verl's client of a retrieval server, which this build has no client for",
    "verl.tools.mcp_search_tool.MCPSearchTool": "verl's client of an MCP search server, which this build has no "
                                                "client for",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "verl's client of a SandboxFusion server; rlforge runs model "
                                                         "code locally in bubblewrap with python_executor",
}
"""verl's tool classes with no rlforge counterpart, and why (one line each instead of an import error)."""


def resolve_class(name: str, registry: Registry[Any], where: str) -> type:
    """The class registered as ``name``, else the class at dotted path ``name``.

    Raises:
        ConfigError: (prefixed with ``where``) not registered and not importable, or missing a method.
    """
    if name in registry:
        return registry.get(name)
    if (why := VERL_TOOLS_NOT_HERE.get(str(name))) is not None:
        raise ConfigError(f"{where}: {name} is {why}; rlforge's tools: {', '.join(registry.names())}")
    mod, _, attr = str(name).rpartition(".")
    cls = None
    if mod:
        try:
            cls = getattr(importlib.import_module(mod), attr, None)
        except Exception as e:  # noqa: BLE001 - any import failure is the user's class path
            raise ConfigError(f"{where}: {name!r} is not a registered name and importing {mod!r} failed "
                              f"({type(e).__name__}: {e}); registered: {', '.join(registry.names())}") from None
    if not isinstance(cls, type):
        raise ConfigError(f"{where}: unknown class {name!r}; registered: {', '.join(registry.names())}, "
                          "or a dotted path to an importable class")
    return cls


def builtin_path(path: str) -> str:
    """``builtin:NAME`` -> the YAML shipped as ``rlforge/tools/configs/NAME.yaml``; other paths unchanged."""
    if str(path).startswith("builtin:"):
        return os.path.join(os.path.dirname(__file__), "configs", str(path)[len("builtin:"):] + ".yaml")
    return path


def _read_yaml(path: str, key: str) -> Any:
    path = builtin_path(path)
    if not os.path.isfile(path):
        raise ConfigError(f"actor_rollout_ref.rollout.multi_turn.{key}={path}: no such file")
    try:
        with open(path) as f:
            return yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


def load_tools(path: str) -> dict[str, BaseTool]:
    """Build the tools of verl's tool config YAML at ``path`` (or ``builtin:calculator``, the shipped
    calculator config); returns ``{function name: tool}``.

    Raises:
        ConfigError: naming ``path`` and the key, for a missing file, invalid YAML, no ``tools`` list,
            an entry that is not a mapping, an unknown ``class_name``, a ``config`` that is not a
            mapping, a ``tool_schema`` that does not parse (:func:`~rlforge.tools.schema.parse_tool_schema`),
            two tools with one function name, or a class whose constructor raises.
    """
    raw = _read_yaml(path, "tool_config_path")
    if not isinstance(raw, dict) or not isinstance(raw.get("tools"), list):
        raise ConfigError(f"{path}: tools: the file must hold a mapping with a 'tools' list")
    out: dict[str, BaseTool] = {}
    for i, entry in enumerate(raw["tools"]):
        where = f"{path}: tools[{i}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: must be a mapping with class_name, config and tool_schema")
        unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown key; an entry has class_name, config, tool_schema")
        if not isinstance(entry.get("class_name"), str):
            raise ConfigError(f"{where}.class_name: missing (a registered name or a dotted class path)")
        cls = resolve_class(entry["class_name"], TOOLS, f"{where}.class_name")
        missing = [m for m in _METHODS if not callable(getattr(cls, m, None))]
        if missing:
            raise ConfigError(f"{where}.class_name: {entry['class_name']} has no {', '.join(missing)} "
                              "(a tool needs create/execute/calc_reward/release)")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ConfigError(f"{where}.config: must be a mapping, got {type(config).__name__}")
        try:
            schema = parse_tool_schema(entry.get("tool_schema"))
        except ValueError as e:
            raise ConfigError(f"{where}.tool_schema: {e}") from None
        if schema.name in out:
            raise ConfigError(f"{where}.tool_schema: function.name: {schema.name!r} is used by another tool")
        try:
            out[schema.name] = cls(config, schema)
        except Exception as e:  # noqa: BLE001 - a constructor error is a config error
            raise ConfigError(f"{where}.config: {entry['class_name']} rejected it ({type(e).__name__}: {e})") from None
    return out

"""Introspection of the config dataclasses: which keys exist, their types, close matches.

The dataclasses are the one source of truth; the loader asks this module whether a
dotted key exists and what type it has, so error messages can name the key, the expected
type and the closest valid key.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import types
import typing
from typing import Any, Literal

Kind = Literal["node", "free", "leaf"]
"""``node`` = a nested dataclass (closed set of keys); ``free`` = a free-form dict or ``Any``
(any keys/values accepted below it); ``leaf`` = a typed scalar or list."""


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """Resolved type annotations of the dataclass ``cls``'s fields, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def strip_optional(tp: Any) -> Any:
    """``X | None`` -> ``X``; any other type unchanged."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def kind_of(tp: Any) -> Kind:
    """Classify a field type as ``node``, ``free`` or ``leaf`` (see :data:`Kind`)."""
    tp = strip_optional(tp)
    if dataclasses.is_dataclass(tp):
        return "node"
    if tp is Any or tp is dict or typing.get_origin(tp) is dict:
        return "free"
    return "leaf"


def type_name(tp: Any) -> str:
    """Short human name of a field type for error messages (``int``, ``list of str``, ``int or null``)."""
    optional = strip_optional(tp) is not tp
    tp = strip_optional(tp)
    if typing.get_origin(tp) is list:
        (arg,) = typing.get_args(tp) or (Any,)
        name = f"list of {getattr(arg, '__name__', str(arg))}"
    elif dataclasses.is_dataclass(tp):
        name = "a mapping"
    else:
        name = getattr(tp, "__name__", str(tp))
    return f"{name} or null" if optional else name


def lookup(root: type, dotted: str) -> Any | None:
    """Type of the field at ``dotted`` below dataclass ``root``; None if the key does not exist.

    Keys below a free-form field return ``Any``.
    """
    cls: Any = root
    for part in dotted.split("."):
        if kind_of(cls) == "free":
            return Any
        if not dataclasses.is_dataclass(cls):
            return None
        hints = field_types(strip_optional(cls))
        if part not in hints:
            return None
        cls = hints[part]
    return cls


@functools.cache
def all_keys(root: type, prefix: str = "") -> tuple[str, ...]:
    """Every dotted key of the schema below ``root`` (nodes and leaves)."""
    out: list[str] = []
    for name, tp in field_types(root).items():
        full = f"{prefix}{name}"
        out.append(full)
        if kind_of(tp) == "node":
            out.extend(all_keys(strip_optional(tp), f"{full}."))
    return tuple(out)


def closest_key(root: type, dotted: str) -> str | None:
    """The valid key most similar to ``dotted`` (difflib), or None when nothing is close."""
    keys = all_keys(root)
    parent, _, leaf = dotted.rpartition(".")
    siblings = [k for k in keys if k.rpartition(".")[0] == parent]
    for pool, cutoff in ((siblings, 0.6), (keys, 0.75)):
        match = difflib.get_close_matches(dotted, pool, n=1, cutoff=cutoff)
        if match:
            return match[0]
    same_leaf = [k for k in keys if k.rpartition(".")[2] == leaf]
    return same_leaf[0] if same_leaf else None

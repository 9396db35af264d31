"""Between the config and the planner: the levers' current and default values, which are the user's,
and writing a plan's choices into the keys the user left free (issue 39)."""

from __future__ import annotations

import functools
from dataclasses import fields, replace
from typing import Any

from rlforge.config.common import get_key
from rlforge.tune.levers import KEYS, Levers
from rlforge.tune.unset import is_users


def _cast(name: str, value: Any) -> Any:
    kind = {f.name: f.type for f in fields(Levers)}[name]
    if kind in ("bool", bool):
        return bool(value)
    if kind in ("int", int):
        return int(value)
    return float(value)


def config_levers(cfg: Any) -> Levers:
    """The levers as ``cfg`` holds them (each lever's first key)."""
    return Levers(**{name: _cast(name, get_key(cfg, keys[0])) for name, keys in KEYS.items()})


@functools.cache
def default_levers() -> Levers:
    """verl's defaults (the schema's, no job)."""
    from rlforge.config import load_config

    return config_levers(load_config([]))


def fixed_levers(cfg: Any) -> dict[str, Any]:
    """Levers whose first key the user set (command line, files, a verl script): name -> the user's value."""
    now = config_levers(cfg)
    return {name: getattr(now, name) for name, keys in KEYS.items() if is_users(cfg, keys[0])}


def set_key(cfg: Any, dotted: str, value: Any) -> None:
    """Set ``dotted`` on the config object ``cfg`` (dataclasses)."""
    *path, leaf = dotted.split(".")
    node = cfg
    for part in path:
        node = getattr(node, part)
    setattr(node, leaf, value)


def apply_levers(cfg: Any, lev: Levers) -> dict[str, Any]:
    """Write ``lev`` into every lever key of ``cfg`` that the user left free; returns key -> value written
    (only the keys whose value changed)."""
    written: dict[str, Any] = {}
    for name, keys in KEYS.items():
        value = getattr(lev, name)
        for key in keys:
            if is_users(cfg, key) or get_key(cfg, key) == value:
                continue
            set_key(cfg, key, value)
            written[key] = value
    return written


def with_fixed(lev: Levers, fixed: dict[str, Any]) -> Levers:
    """``lev`` with the user's values put back."""
    return replace(lev, **fixed)


def override_line(lev: Levers, base: Levers) -> str:
    """The overrides that turn ``base`` into ``lev`` (first key of each lever), to paste after ``rlforge train``."""
    parts = []
    for name, keys in KEYS.items():
        value = getattr(lev, name)
        if value != getattr(base, name):
            shown = str(value).lower() if isinstance(value, bool) else value
            parts.append(f"{keys[0]}={shown}")
    return " ".join(parts)

"""Which lever keys the tuner may write: those the user did not set, following interpolations.

A key is the user's when :func:`rlforge.config.user_keys.user_set` says so, or when its schema default
is an interpolation (``${actor_rollout_ref.actor.ppo_max_token_len_per_gpu}``, ``${.ppo_max_token_len_per_gpu}``)
of a key that is the user's: ``ref.log_prob_max_token_len_per_gpu`` follows a user's
``actor.ppo_max_token_len_per_gpu``.  A config built in code (no record of user keys) counts every key
as the user's, so the tuner leaves it alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rlforge.config import schema
from rlforge.config.root import RLForgeConfig
from rlforge.config.user_keys import user_set


def _default(dotted: str) -> Any:
    """The schema default of ``dotted`` (the raw field default: an ``${...}`` string for interpolations)."""
    cls: Any = RLForgeConfig
    parts = dotted.split(".")
    for part in parts[:-1]:
        cls = schema.strip_optional(schema.field_types(cls)[part])
    field = next(f for f in dataclasses.fields(cls) if f.name == parts[-1])
    return field.default


def interpolation_source(dotted: str) -> str | None:
    """The absolute key that ``dotted``'s schema default interpolates, or None."""
    value = _default(dotted)
    if not (isinstance(value, str) and value.startswith("${") and value.endswith("}")):
        return None
    ref = value[2:-1]
    if not ref.startswith("."):
        return ref
    parent = dotted.split(".")[:-1]
    ups = len(ref) - len(ref.lstrip(".")) - 1
    return ".".join(parent[: len(parent) - ups] + [ref.lstrip(".")])


def is_users(cfg: Any, dotted: str) -> bool:
    """Whether the user set ``dotted``, directly or through the key its default interpolates."""
    seen: set[str] = set()
    key: str | None = dotted
    while key is not None and key not in seen:
        if user_set(cfg, key):
            return True
        seen.add(key)
        key = interpolation_source(key)
    return False


def free_keys(cfg: Any, keys: list[str] | tuple[str, ...] | set[str]) -> set[str]:
    """The keys of ``keys`` the tuner may write in ``cfg``."""
    return {k for k in keys if not is_users(cfg, k)}

"""Two spellings of one key in one layer with different values: an error, not a silent pick.

A layer (one YAML file, one override) may name a key twice: under rlforge's name and under one of
verl's aliases (:data:`rlforge.config.verl_keys.ALIASES`: ``actor.optim.clip_grad`` for
``actor.grad_clip``; the SFT trainer's ``engine.strategy`` for ``model.strategy``).  verl reads one or the
other depending on the worker, and within a layer there is no order that says which one the user meant
(a dumped verl config carries both; editing one must not be undone by the other), so different values
are refused with one line naming both keys.  Equal values are fine.  Across layers the later layer
wins, as for any key.  An older spelling of one key (``optim.warmup_style``, the loader's
``KEY_ALIASES``) is not an alias here: verl reads the older spelling where both are given, and so does
rlforge.
"""

from __future__ import annotations

from typing import Any

from rlforge.errors import ConfigError

_MISSING = object()


class Moved(dict[str, Any]):
    """rlforge's dotted key -> the value an alias set on it, with ``origin``: rlforge's key -> the alias."""

    def __init__(self) -> None:
        super().__init__()
        self.origin: dict[str, str] = {}

    def put(self, target: str, value: Any, alias: str, source: str) -> None:
        """Set ``target`` from ``alias``; raise when another alias of the layer set it differently."""
        if target in self and self[target] != value:
            raise conflict(self.origin[target], self[target], alias, value, source)
        self[target] = value
        self.origin[target] = alias


def conflict(key_a: str, value_a: Any, key_b: str, value_b: Any, source: str) -> ConfigError:
    """The one-line error for ``key_a`` and ``key_b`` (one key's two spellings) given different values."""
    where = source if source.startswith("override") else f"in {source}"
    return ConfigError(f"{key_a}={value_a!r} and {key_b}={value_b!r} ({where}) are two names of one key with "
                       f"different values; keep one of them")


def check_moved(layer: dict[str, Any], moved: Moved, source: str) -> None:
    """Raise when a key an alias set (``moved``) is also in ``layer`` (nested, rlforge's names) with
    another value.  Keys a group choice set (``model_engine=megatron``) are not checked."""
    for target, alias in moved.origin.items():
        value = moved[target]
        node: Any = layer
        for part in target.split("."):
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is not _MISSING and node != value:
            raise conflict(target, node, alias, value, source)

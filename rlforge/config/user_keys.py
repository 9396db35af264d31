"""Which config keys the user gave: the ``--config`` file and the command-line overrides.

The embedded job and the schema defaults are rlforge's choices, not the user's.  A warning about a
key (``config/later_work.py``, the model builders) is printed only when the user set that key:
:func:`user_set`.  :func:`rlforge.config.load_config` records the keys on the config it returns.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

_ATTR = "_rlforge_user_keys"


def leaf_keys(tree: Mapping[str, Any], prefix: str = "") -> set[str]:
    """The dotted keys of the leaves of ``tree`` (a mapping is a node; anything else, lists included,
    a leaf).  ``{"a": {"b": 1, "c": [2]}}`` -> ``{"a.b", "a.c"}``; an empty mapping is a leaf."""
    out: set[str] = set()
    for key, value in tree.items():
        full = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= leaf_keys(value, f"{full}.")
        else:
            out.add(full)
    return out


def record_user_keys(cfg: Any, keys: Iterable[str]) -> None:
    """Record on ``cfg`` (a loaded config object) the dotted keys the user gave."""
    object.__setattr__(cfg, _ATTR, frozenset(keys))


def user_keys(cfg: Any) -> frozenset[str] | None:
    """The keys recorded by :func:`record_user_keys`; None for a config built in code (no record)."""
    return getattr(cfg, _ATTR, None)


def user_set(cfg: Any, *keys: str) -> bool:
    """Whether the user gave any of ``keys`` (dotted), a key below one (``a.b.c`` for ``a.b``) or a
    key above one (a whole block, ``a`` for ``a.b``).  True for a config with no record (built in
    code, e.g. by a test): every key then counts as the user's."""
    given = user_keys(cfg)
    if given is None:
        return True
    for key in keys:
        parts = key.split(".")
        if any(".".join(parts[:i]) in given for i in range(1, len(parts) + 1)):
            return True
        if any(k.startswith(key + ".") for k in given):
            return True
    return False


_VERL_ATTR = "_rlforge_verl_values"


def record_verl_values(cfg: Any, values: Mapping[str, Any]) -> None:
    """Record on ``cfg`` the verl-only keys the layers gave (dotted key -> value;
    :mod:`rlforge.config.verl_keys`), for their warnings."""
    object.__setattr__(cfg, _VERL_ATTR, dict(values))


def verl_values(cfg: Any) -> dict[str, Any]:
    """The verl-only keys recorded by :func:`record_verl_values` (empty when none)."""
    return dict(getattr(cfg, _VERL_ATTR, {}))

"""Hydra's delete overrides, ``~key`` and ``~key=value``, on rlforge's typed config.

Hydra removes the key from the config.  A typed schema cannot lose a key, so a schema key (or a whole
block: ``~critic.optim``) goes back to its schema default; a key below a free-form field
(``~actor_rollout_ref.model.override_config.attention_dropout``) is removed.  ``~key=value`` deletes
only when the key's current value is ``value``; otherwise it is an error, as in Hydra.  A key that
rlforge does not have, or a free-form entry that is not there, warns and changes nothing (a verl
script may delete a key of verl's that rlforge never had).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlforge.config import schema, verl_keys
from rlforge.config.root import RLForgeConfig
from rlforge.config.yaml_file import ConfigWarning, first_line
from rlforge.errors import ConfigError

_UNSET = object()
UNSET = _UNSET
"""The value of a :class:`Deletion` that deletes whatever the key holds."""


class Deletion(NamedTuple):
    """One ``~key`` / ``~key=value`` override: the dotted key (aliases resolved), the value it must
    have to be deleted (``_UNSET`` = any), and the override as written."""

    key: str
    value: Any
    text: str


def parse_deletion(override: str, canonical: Callable[[str], str]) -> Deletion:
    """``~a.b`` or ``~a.b=value`` as a :class:`Deletion`; ``canonical`` maps older key names to current.

    Raises:
        ConfigError: no key after ``~``, or a value that does not parse.
    """
    body = override.strip()[1:]
    key, sep, raw = body.partition("=")
    key = key.strip()
    if not key or key.startswith(("~", "+")):
        raise ConfigError(f"override '{override}' is not of the form ~key or ~key=value (e.g. ~trainer.logger)")
    value: Any = _UNSET
    if sep:
        try:
            parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]), resolve=False)
        except Exception as e:
            raise ConfigError(f"override '{override}': cannot parse the value: {first_line(e)}") from None
        assert isinstance(parsed, dict)
        value = parsed["v"]
    return Deletion(canonical(key), value, override.strip())


def apply_deletion(cfg: DictConfig, deletion: Deletion, defaults: DictConfig) -> None:
    """Delete ``deletion.key`` from ``cfg`` in place (module doc); ``defaults`` is the schema's defaults.

    Raises:
        ConfigError: ``~key=value`` when the key's value is not ``value``.
    """
    key = deletion.key
    tp = schema.lookup(RLForgeConfig, key)
    if tp is None and (verl_keys.is_verl_only(key) or verl_keys.is_verl_node(key)):
        return  # a verl key rlforge sets aside: the loader drops what earlier layers gave (no warning then)
    if tp is None:
        warnings.warn(f"ignoring '{deletion.text}': not an rlforge config key, nothing to delete", ConfigWarning, 4)
        return
    parent_key, _, leaf = key.rpartition(".")
    in_schema = schema.kind_of(schema.lookup(RLForgeConfig, parent_key) if parent_key else RLForgeConfig) == "node"
    parent = OmegaConf.select(cfg, parent_key) if parent_key else cfg
    if not isinstance(parent, DictConfig) or leaf not in parent:
        warnings.warn(f"ignoring '{deletion.text}': {key} is not set, nothing to delete", ConfigWarning, 4)
        return
    _check_value(cfg, deletion)
    if in_schema:
        OmegaConf.update(cfg, key, _default(defaults, key), merge=False)
    else:
        del parent[leaf]


def _check_value(cfg: DictConfig, deletion: Deletion) -> None:
    if deletion.value is _UNSET:
        return
    try:
        current = OmegaConf.select(cfg, deletion.key)
        if OmegaConf.is_config(current):
            current = OmegaConf.to_container(current, resolve=True)
    except OmegaConfBaseException:
        current = _UNSET
    if current != deletion.value:
        raise ConfigError(f"override '{deletion.text}': {deletion.key} is {current!r}, not {deletion.value!r}; "
                          f"nothing deleted (write ~{deletion.key} to delete it whatever its value)")


def _default(defaults: DictConfig, key: str) -> Any:
    """The schema default at ``key``, interpolations kept (``${...}`` follows its source again)."""
    parent_key, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(defaults, parent_key) if parent_key else defaults
    assert isinstance(parent, DictConfig)
    node = parent._get_node(leaf)  # the node, not its resolved value
    if isinstance(node, DictConfig):
        return copy.deepcopy(node)
    raw = OmegaConf.to_container(parent, resolve=False)
    assert isinstance(raw, dict)
    return copy.deepcopy(raw[leaf])

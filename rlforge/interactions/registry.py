"""The interaction registry and verl's interaction config YAML loader.

``rollout.multi_turn.interaction_config_path`` names a YAML file in verl's format::

    interaction:
      - name: gsm8k                                   # what extra_info.interaction_kwargs.name selects
        class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction   # or rlforge's: gsm8k
        config: {}

Every mistake is one :class:`~rlforge.errors.ConfigError` naming the file and the key.
"""

from __future__ import annotations

from typing import Any

from rlforge.errors import ConfigError
from rlforge.registry import Registry

INTERACTIONS: Registry[type] = Registry("interaction class",
                                        "rollout.multi_turn.interaction_config_path: interaction[].class_name")
"""Interaction classes by name: ``gsm8k`` (also verl's class path)."""

_METHODS = ("start_interaction", "generate_response", "calculate_score", "finalize_interaction")


def load_interactions(path: str) -> dict[str, Any]:
    """Build the interactions of the YAML at ``path``; returns ``{name: interaction}`` in file order.

    Raises:
        ConfigError: naming ``path`` and the key, for a missing file, invalid YAML, no ``interaction``
            list, an unknown ``class_name``, a class without verl's four methods, a ``config`` that is not
            a mapping, a repeated ``name``, or a constructor that raises.
    """
    from rlforge.tools.registry import _read_yaml, resolve_class

    raw = _read_yaml(path, "interaction_config_path")
    if not isinstance(raw, dict) or not isinstance(raw.get("interaction"), list) or not raw["interaction"]:
        raise ConfigError(f"{path}: interaction: the file must hold a mapping with a non-empty 'interaction' list")
    out: dict[str, Any] = {}
    for i, entry in enumerate(raw["interaction"]):
        where = f"{path}: interaction[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise ConfigError(f"{where}.class_name: missing (each entry has name, class_name, config)")
        cls = resolve_class(entry["class_name"], INTERACTIONS, f"{where}.class_name")
        missing = [m for m in _METHODS if not callable(getattr(cls, m, None))]
        if missing:
            raise ConfigError(f"{where}.class_name: {entry['class_name']} has no {', '.join(missing)}")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ConfigError(f"{where}.config: must be a mapping, got {type(config).__name__}")
        name = str(entry.get("name") or entry["class_name"].rsplit(".", 1)[-1])
        if name in out:
            raise ConfigError(f"{where}.name: {name!r} is used by another interaction")
        try:
            out[name] = cls({**config, "name": name})
        except Exception as e:  # noqa: BLE001
            raise ConfigError(f"{where}.config: {entry['class_name']} rejected it ({type(e).__name__}: {e})") from None
    return out

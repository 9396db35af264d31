"""Build an :class:`RLForgeConfig` from layers: schema defaults <- job <- ``--config`` file <- overrides.

Override grammar (the subset of Hydra's that verl command lines use):

* ``a.b.c=value``  set an existing key; an unknown key raises :class:`ConfigError` with the
  closest valid key.  Keys below free-form dict fields (``override_config``, ``engine_kwargs``,
  ...) are always accepted.
* ``+a.b=value`` / ``++a.b=value``  add a key: kept inside free-form fields, a plain set on an
  existing key, and ignored with a :class:`ConfigWarning` when the key is not in the schema.
* ``~a.b``  deleting keys is not supported (raises).

Values are parsed as YAML by OmegaConf (``null``, ``1e-6``, ``true``, ``[console,file]``).
Aliases: ``optim.warmup_style`` (older verl) sets ``optim.lr_scheduler_type``.  Hydra metadata
(``_target_`` keys anywhere, a root ``defaults`` list, a root ``hydra`` block) in YAML files is ignored.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlforge.config import schema
from rlforge.config.common import OptimConfig
from rlforge.config.root import RLForgeConfig
from rlforge.config.user_keys import leaf_keys, record_user_keys
from rlforge.errors import ConfigError, RLForgeWarning

KEY_ALIASES: dict[type, dict[str, str]] = {OptimConfig: {"warmup_style": "lr_scheduler_type"}}
"""Older verl key names accepted per dataclass: ``{dataclass: {old_name: current_name}}``."""

_IGNORED_KEYS = ("_target_",)
_IGNORED_ROOT_KEYS = ("defaults", "hydra")


class ConfigWarning(RLForgeWarning):
    """A config key was accepted but has no effect (unknown ``+key``, ignored Hydra metadata)."""


def load_config(
    overrides: Sequence[str] = (), config_file: str | None = None, job: str | None = None
) -> RLForgeConfig:
    """Return the resolved config: schema defaults <- job ``job`` <- ``config_file`` <- ``overrides``.

    Args:
        overrides: CLI overrides such as ``"data.train_batch_size=8"`` (grammar in the module doc).
        config_file: YAML file of overrides in the same tree shape; None = none.
        job: name of an embedded job (``rlforge/config/jobs/<job>.yaml``); None = none.

    Returns:
        Dataclass instances with interpolations resolved, carrying the keys that ``config_file`` and
        ``overrides`` gave (:func:`rlforge.config.user_keys.user_set`).  Not validated: call
        :func:`rlforge.config.validate_config` for cross-field checks.

    Raises:
        ConfigError: unknown key (with the closest valid key), wrong type, unreadable file,
            unknown job, malformed override.
    """
    layers: list[tuple[dict[str, Any], str]] = []
    if job is not None:
        layers.append((_clean_layer(_read_yaml(_job_path(job), f"job '{job}'"), f"job '{job}'"), f"job '{job}'"))
    if config_file is not None:
        source = f"config file '{config_file}'"
        layers.append((_clean_layer(_read_yaml(Path(config_file), source), source), source))
    for override in overrides:
        source = f"override '{override}'"
        layers.append((_clean_layer(_parse_override(override), source, override.lstrip().startswith("+")), source))
    cfg = _merge_all(layers)
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "?"
        raise ConfigError(f"cannot resolve config key '{key}': {_first_line(e)}; set {key} to a value "
                          f"({key}=...)") from None
    assert isinstance(obj, RLForgeConfig)  # internal invariant, not user input
    record_user_keys(obj, (k for cleaned, source in layers if not source.startswith("job ")
                           for k in leaf_keys(cleaned)))
    return obj


def available_jobs() -> list[str]:
    """Names of the embedded jobs (``rlforge/config/jobs/*.yaml``)."""
    folder = resources.files("rlforge.config") / "jobs"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def _job_path(job: str) -> Path:
    path = Path(str(resources.files("rlforge.config") / "jobs" / f"{job}.yaml"))
    if not path.is_file():
        raise ConfigError(f"unknown job '{job}'; available jobs: {', '.join(available_jobs())}")
    return path


def _read_yaml(path: Path, source: str) -> dict[str, Any]:
    try:
        loaded = OmegaConf.load(path)
    except FileNotFoundError:
        raise ConfigError(f"{source}: file not found; check the path given to --config") from None
    except OSError as e:
        raise ConfigError(f"{source}: cannot read it: {_first_line(e)}") from None
    except yaml.MarkedYAMLError as e:
        raise ConfigError(yaml_error_message(e, source)) from None
    except Exception as e:  # yaml.YAMLError and OmegaConf's errors share no base class
        raise ConfigError(f"{source}: not valid YAML: {_one_line(e)}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{source}: expected a mapping of config keys at the top level, got a list")
    data = OmegaConf.to_container(loaded, resolve=False)
    assert isinstance(data, dict)
    for key in _IGNORED_ROOT_KEYS:
        if key in data:
            data.pop(key)
            warnings.warn(f"{source}: ignoring Hydra '{key}' block; rlforge has no config groups", ConfigWarning, 2)
    return data


def _at(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}"


def yaml_error_message(e: yaml.MarkedYAMLError, source: str) -> str:
    """One line for a YAML syntax error or duplicated key: ``source``, the line and column
    (1-based) where the parser stopped, the cause, and where the enclosing construct began.

    Example: ``config file 'job.yaml', line 3, column 3: duplicate key 'b' (the mapping starts at
    line 2, column 3); keep one of them``.
    """
    problem = " ".join(str(e.problem or "invalid YAML").split())
    where = _at(e.problem_mark) if e.problem_mark is not None else "unknown position"
    duplicate = re.fullmatch(r"found duplicate key (.+)", problem)
    if duplicate:
        start = f" (the mapping starts at {_at(e.context_mark)})" if e.context_mark is not None else ""
        return f"{source}, {where}: duplicate key '{duplicate.group(1)}'{start}; keep one of them"
    context = ""
    if e.context and not (e.context_mark is not None and e.problem_mark is not None
                          and (e.context_mark.line, e.context_mark.column)
                          == (e.problem_mark.line, e.problem_mark.column)):
        started = f" started at {_at(e.context_mark)}" if e.context_mark is not None else ""
        context = f" ({' '.join(str(e.context).split())}{started})"
    return f"{source}, {where}: not valid YAML: {problem}{context}"


def _one_line(e: BaseException) -> str:
    """The whole message of ``e`` on one line."""
    return " ".join(str(e).split()) or type(e).__name__


def _parse_override(override: str) -> dict[str, Any]:
    text = override.strip()
    if text.startswith("~"):
        raise ConfigError(f"override '{override}': deleting keys (~key) is not supported; set the key to null instead")
    body = text.lstrip("+")
    key, sep, _ = body.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override '{override}' is not of the form key=value (e.g. data.train_batch_size=8)")
    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([body]), resolve=False)
    except Exception as e:
        raise ConfigError(f"override '{override}': cannot parse the value: {_first_line(e)}") from None
    assert isinstance(parsed, dict)
    return parsed


def _clean(cls: type, node: dict[str, Any], prefix: str, source: str, plus: bool,
           root: type = RLForgeConfig) -> dict[str, Any]:
    """Check ``node`` (a layer below dataclass ``cls`` at ``prefix``) against the schema.

    Renames aliases, drops Hydra ``_target_`` keys, wraps a scalar given for a ``list[str]``
    field, and drops unknown keys with a warning when ``plus`` (else raises).
    """
    hints = schema.field_types(cls)
    aliases = KEY_ALIASES.get(cls, {})
    out: dict[str, Any] = {}
    for raw_key, value in node.items():
        key = aliases.get(str(raw_key), str(raw_key))
        full = f"{prefix}{key}"
        if key in _IGNORED_KEYS:
            continue
        if key not in hints:
            if plus:
                shown = full + _tail(value)
                warnings.warn(f"ignoring '+{shown}': not an rlforge config key, rlforge ignores it", ConfigWarning, 3)
                continue
            hint = schema.closest_key(root, full)
            suggestion = f"; did you mean '{hint}'?" if hint else "; see `rlforge train --print-config` for valid keys"
            where = "" if source.startswith("override") else f" in {source}"
            raise ConfigError(f"unknown config key '{full}'{where}{suggestion}")
        tp = hints[key]
        kind = schema.kind_of(tp)
        if kind == "node":
            if isinstance(value, dict):
                value = _clean(schema.strip_optional(tp), value, f"{full}.", source, plus, root)
            elif not _is_interpolation(value):
                raise ConfigError(f"{full}: expected a mapping of sub-keys, got {value!r} (from {source})")
        elif schema.strip_optional(tp) == list[str] and isinstance(value, str) and not _is_interpolation(value):
            value = [value]
        out[key] = value
    return out


@functools.cache
def _schema_defaults(root: type = RLForgeConfig) -> DictConfig:
    """The schema's defaults as a read-only DictConfig, built once (building it is most of a load's time)."""
    base = OmegaConf.structured(root)
    OmegaConf.set_readonly(base, True)
    return base


def _clean_layer(layer: dict[str, Any], source: str, plus: bool = False, root: type = RLForgeConfig) -> dict[str, Any]:
    return _clean(root, layer, "", source, plus, root)


def load_schema(root: type, overrides: Sequence[str] = (), config_file: str | None = None) -> Any:
    """The dataclass ``root`` (another entry point's schema, e.g. the SFT trainer's) built from its
    defaults <- ``config_file`` <- ``overrides``, with the same grammar and errors as :func:`load_config`
    (unknown key: one :class:`ConfigError` naming the closest key of ``root``).

    Returns:
        an instance of ``root`` with interpolations resolved (not validated).
    Raises:
        ConfigError: as :func:`load_config`.
    """
    layers: list[tuple[dict[str, Any], str]] = []
    if config_file is not None:
        source = f"config file '{config_file}'"
        layers.append((_clean_layer(_read_yaml(Path(config_file), source), source, root=root), source))
    for override in overrides:
        source = f"override '{override}'"
        plus = override.lstrip().startswith("+")
        layers.append((_clean_layer(_parse_override(override), source, plus, root), source))
    cfg = _merge_all(layers, root)
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "?"
        raise ConfigError(f"cannot resolve config key '{key}': {_first_line(e)}; set {key} to a value "
                          f"({key}=...)") from None
    assert isinstance(obj, root)  # internal invariant, not user input
    return obj


def _merge_all(layers: list[tuple[dict[str, Any], str]], root: type = RLForgeConfig) -> DictConfig:
    """Merge every layer onto the schema defaults in one pass (one copy of the tree); on a type error,
    merge layer by layer so that the message names the layer that brought the bad value."""
    try:
        merged = OmegaConf.merge(_schema_defaults(root), *(OmegaConf.create(c) for c, _ in layers))
    except OmegaConfBaseException:
        merged = _schema_defaults(root)
        for cleaned, source in layers:
            merged = _merge(merged, cleaned, source, root)
    assert isinstance(merged, DictConfig)
    OmegaConf.set_readonly(merged, False)
    return merged


def _merge(cfg: DictConfig, cleaned: dict[str, Any], source: str, root: type = RLForgeConfig) -> DictConfig:
    try:
        merged = OmegaConf.merge(cfg, OmegaConf.create(cleaned))
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "")
        tp = schema.lookup(root, key) if key else None
        if tp is None:
            raise ConfigError(f"{source}: {_first_line(e)}") from None
        value = _value_at(cleaned, key)
        raise ConfigError(f"{key}: expected {schema.type_name(tp)}, got {value!r} (from {source})") from None
    assert isinstance(merged, DictConfig)
    return merged


def _value_at(tree: dict[str, Any], dotted: str) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return "?"
        node = node[part]
    return node


def _tail(value: Any) -> str:
    """``.b.c`` for ``{"b": {"c": 1}}`` (the rest of a single-path override), else ``""``."""
    tail = ""
    while isinstance(value, dict) and len(value) == 1:
        (key, value), = value.items()
        tail += f".{key}"
    return tail


def _is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


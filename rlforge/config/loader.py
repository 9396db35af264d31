"""Build an :class:`RLForgeConfig` from layers: schema defaults <- job <- Hydra config
(``--config-path/--config-name``) <- ``--config`` file <- overrides.

Override grammar (Hydra's, as verl command lines use it; https://hydra.cc/docs/advanced/override_grammar/basic/):

* ``a.b.c=value``  set an existing key; an unknown key raises :class:`ConfigError` with the
  closest valid key.  Keys below free-form dict fields (``override_config``, ``engine_kwargs``,
  ...) are always accepted.
* ``+a.b=value`` (add) / ``++a.b=value`` (set or add): kept inside free-form fields, a plain set on
  an existing key, and ignored with a :class:`ConfigWarning` when the key is not in the schema.
  Hydra refuses ``+`` on a key that exists; rlforge sets it, because its schema has keys that
  verl's lacks (a verl script adds them with ``+``).
* ``~a.b`` / ``~a.b=value``  delete: a schema key (or a whole block) goes back to its schema
  default, a key below a free-form field is removed; with ``=value``, only when the key's value is
  ``value`` (else an error, as in Hydra).  A key rlforge does not have warns and changes nothing.
  Overrides apply in order: ``a=1 ~a`` leaves ``a`` at its default, ``~a a=1`` sets it.

The Hydra config and a ``--config`` file may carry a ``defaults:`` list: resolved by
:mod:`rlforge.config.hydra_compose` against rlforge's built-in groups (verl's).  Values are parsed
as YAML by OmegaConf (``null``, ``1e-6``, ``true``, ``[console,file]``); a dict value written as Hydra
writes it, ``{enable_thinking:false}`` (no space after the colon), reads as Hydra reads it
(:func:`hydra_flow_value`).  Aliases:
``optim.warmup_style`` (older verl) sets ``optim.lr_scheduler_type``.  Hydra's ``_target_`` keys are
ignored anywhere.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, NamedTuple

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from rlforge.config import schema, verl_keys
from rlforge.config.alias_conflicts import Moved, check_moved
from rlforge.config.auto_keys import AUTO, record_auto_keys, strip_auto
from rlforge.config.common import OptimConfig
from rlforge.config.delete_key import UNSET, Deletion, apply_deletion, parse_deletion
from rlforge.config.hydra_compose import ComposedLayer, compose_file, compose_named
from rlforge.config.root import RLForgeConfig
from rlforge.config.split_trainer import split_trainer_batch
from rlforge.config.user_keys import leaf_keys, record_user_keys, record_verl_values
from rlforge.config.world import node_gpus_from_verl_default
from rlforge.config.yaml_file import ConfigWarning, first_line, read_yaml, yaml_error_message
from rlforge.errors import ConfigError

__all__ = ["KEY_ALIASES", "ConfigWarning", "available_jobs", "load_config", "yaml_error_message"]

KEY_ALIASES: dict[type, dict[str, str]] = {OptimConfig: {"warmup_style": "lr_scheduler_type"}}
"""Older verl key names accepted per dataclass: ``{dataclass: {old_name: current_name}}``."""

_IGNORED_KEYS = ("_target_",)


class _Layer(NamedTuple):
    """A checked layer: its keys, where it came from, and whether the user gave them (not the job
    or rlforge's built-in groups)."""

    data: dict[str, Any]
    source: str
    from_user: bool
    verl: dict[str, Any] = {}  # noqa: RUF012 - never mutated: each layer gets its own dict
    """verl-only keys of the layer (dotted -> value; :mod:`rlforge.config.verl_keys`)."""


def _layer(data: dict[str, Any], source: str, from_user: bool, plus: bool = False) -> _Layer:
    """A checked layer of ``data`` (verl's aliases moved onto rlforge's keys, verl-only keys set aside)."""
    verl: dict[str, Any] = {}
    return _Layer(_clean_layer(data, source, plus, verl=verl), source, from_user, verl)


def load_config(
    overrides: Sequence[str] = (), config_file: str | None = None, job: str | None = None,
    config_path: str | None = None, config_name: str | None = None,
) -> RLForgeConfig:
    """Return the resolved config: schema defaults <- job ``job`` <- the Hydra config
    ``config_path/config_name`` <- ``config_file`` <- ``overrides``.

    Args:
        overrides: CLI overrides such as ``"data.train_batch_size=8"``, ``"+a.b=1"``, ``"~a.b"``
            (grammar in the module doc).
        config_file: YAML file of overrides in the same tree shape (a ``defaults:`` list is resolved);
            None = none.
        job: name of an embedded job (``rlforge/config/jobs/<job>.yaml``); None = none.
        config_path: Hydra's ``--config-path``, read from the current directory; None = none given.
        config_name: Hydra's ``--config-name`` (``.yaml`` optional); with both None, no Hydra config.
            verl's ``ppo_trainer`` and ``ppo_megatron_trainer`` are built in
            (:func:`rlforge.config.hydra_compose.compose_named`).

    Returns:
        Dataclass instances with interpolations resolved, carrying the keys that the user's files
        and ``overrides`` gave (:func:`rlforge.config.user_keys.user_set`).  Not validated: call
        :func:`rlforge.config.validate_config` for cross-field checks.

    Raises:
        ConfigError: unknown key (with the closest valid key), wrong type, unreadable file,
            unknown job, malformed override, a bad ``defaults`` entry (file and line).
    """
    layers: list[_Layer | Deletion] = []
    if job is not None:
        source = f"job '{job}'"
        layers.append(_layer(read_yaml(_job_path(job), source), source, False))
    composed: list[ComposedLayer] = []
    if config_path is not None or config_name is not None:
        composed += compose_named(config_path, config_name)
    if config_file is not None:
        composed += compose_file(Path(config_file), f"config file '{config_file}'")
    layers += [_layer(c.data, c.source, c.from_user) for c in composed]
    for override in overrides:
        source = f"override '{override}'"
        if override.strip().startswith("~"):
            layers += _deletions(parse_deletion(override, _deletion_key))
        else:
            plus = override.lstrip().startswith("+")
            layers.append(_layer(_parse_override(override), source, True, plus))
    layers, autos = _without_auto(layers)
    cfg = _merge_all(layers)
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "?"
        raise ConfigError(f"cannot resolve config key '{key}': {first_line(e)}; set {key} to a value "
                          f"({key}=...)") from None
    assert isinstance(obj, RLForgeConfig)  # internal invariant, not user input
    record_user_keys(obj, _user_keys(layers))
    record_auto_keys(obj, autos)
    record_verl_values(obj, _verl_values(layers))
    if job is None:  # verl's defaults: an unset trainer.n_gpus_per_node means the node's GPUs
        node_gpus_from_verl_default(obj)
    split_trainer_batch(obj)  # verl's fully-async data.train_batch_size=0
    return obj


def _deletion_key(dotted: str) -> str:
    """The key a ``~dotted`` deletes: rlforge's key for a verl alias (``~actor_rollout_ref.actor.optim.clip_grad``
    deletes ``actor_rollout_ref.actor.grad_clip``), else ``dotted`` with older names made current."""
    return verl_keys.alias_of(dotted) or _canonical_key(dotted)


def _deletions(deletion: Deletion) -> list[Deletion]:
    """``deletion``, and for ``~block`` of verl's that holds aliases (``~actor_rollout_ref.model.lora``), one
    deletion of each rlforge key they map onto."""
    head = deletion.key + "."
    targets = [t for k, t in verl_keys.ALIASES.items() if k.startswith(head)]
    if schema.lookup(RLForgeConfig, deletion.key) is not None or not targets or deletion.value is not UNSET:
        return [deletion]
    return [deletion, *(Deletion(t, UNSET, deletion.text) for t in targets)]


def _verl_values(layers: Sequence[_Layer | Deletion]) -> dict[str, Any]:
    """The verl-only keys the layers gave (dotted -> value), in order, less those a later ``~key`` deleted
    (the key itself or a block above it)."""
    out: dict[str, Any] = {}
    for layer in layers:
        if isinstance(layer, Deletion):
            out = {k: v for k, v in out.items() if k != layer.key and not k.startswith(layer.key + ".")}
        else:
            out.update(layer.verl)
    return out


def _without_auto(layers: Sequence[_Layer | Deletion]) -> tuple[list[_Layer | Deletion], set[str]]:
    """The layers with every ``key=auto`` replaced by a deletion of ``key`` (back to the schema default,
    so an earlier layer's value is dropped too), and the keys left ``auto`` at the end (a later layer's
    value or ``~key`` takes a key back from ``auto``).  Raises ConfigError for ``auto`` on a key with no
    tuner (:func:`rlforge.config.auto_keys.strip_auto`)."""
    out: list[_Layer | Deletion] = []
    autos: set[str] = set()
    for layer in layers:
        if isinstance(layer, Deletion):
            autos = {k for k in autos if k != layer.key and not k.startswith(layer.key + ".")}
            out.append(layer)
            continue
        found = strip_auto(layer.data)
        autos -= leaf_keys(layer.data)
        out += [Deletion(k, UNSET, f"{k}=auto") for k in found]
        autos |= set(found) if layer.from_user else set()
        out.append(layer)
    return out, autos


def _user_keys(layers: Sequence[_Layer | Deletion]) -> set[str]:
    """The dotted keys the user's layers gave, less those a later ``~key`` deleted."""
    keys: set[str] = set()
    for layer in layers:
        if isinstance(layer, Deletion):
            keys = {k for k in keys if k != layer.key and not k.startswith(layer.key + ".")}
        elif layer.from_user:
            keys |= leaf_keys(layer.data)
    return keys


def _canonical_key(dotted: str) -> str:
    """``dotted`` with older verl names (:data:`KEY_ALIASES`) replaced by the current ones."""
    cls: Any = RLForgeConfig
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        cls = schema.strip_optional(cls)
        if schema.kind_of(cls) != "node":
            break
        parts[i] = KEY_ALIASES.get(cls, {}).get(part, part)
        cls = schema.field_types(cls).get(parts[i])
        if cls is None:
            break
    return ".".join(parts)


def available_jobs() -> list[str]:
    """Names of the embedded jobs (``rlforge/config/jobs/*.yaml``)."""
    folder = resources.files("rlforge.config") / "jobs"
    return sorted(p.name.removesuffix(".yaml") for p in folder.iterdir() if p.name.endswith(".yaml"))


def _job_path(job: str) -> Path:
    path = Path(str(resources.files("rlforge.config") / "jobs" / f"{job}.yaml"))
    if not path.is_file():
        raise ConfigError(f"unknown job '{job}'; available jobs: {', '.join(available_jobs())}")
    return path


_FLOW_KEY = re.compile(r"([{,]\s*)([A-Za-z_$][\w$\-]*)\s*:(?=\S|$)")
"""A dict key right after ``{`` or ``,`` followed by ``:`` and no space (Hydra's ``{a:1}``)."""


def hydra_flow_value(value: str) -> str:
    """``value`` with a space after each dict key's colon outside quotes, so that YAML reads Hydra's
    ``{enable_thinking:false}`` as Hydra does (``{'enable_thinking': False}``), not as the key
    ``'enable_thinking:false'`` with a null value.  Values that are no dict or list come back unchanged."""
    if not value.lstrip().startswith(("{", "[")):
        return value
    parts = re.split(r"""('[^']*'|"[^"]*")""", value)  # odd indices: quoted strings, left alone
    return "".join(p if i % 2 else _FLOW_KEY.sub(r"\1\2: ", p) for i, p in enumerate(parts))


def _parse_override(override: str) -> dict[str, Any]:
    text = override.strip()
    body = text.lstrip("+")
    key, sep, value = body.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override '{override}' is not of the form key=value (e.g. data.train_batch_size=8)")
    body = f"{key}={hydra_flow_value(value)}"
    try:
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([body]), resolve=False)
    except Exception as e:
        raise ConfigError(f"override '{override}': cannot parse the value: {first_line(e)}") from None
    assert isinstance(parsed, dict)
    _hydra_bools(parsed, key.strip(), value.strip())
    return parsed


def _hydra_bools(parsed: dict[str, Any], key: str, text: str) -> None:
    """In place: the value of ``key`` that YAML 1.1 reads as a boolean but Hydra's override grammar does not
    (``yes``, ``no``, ``on``, ``off``: Hydra's booleans are ``true`` and ``false``, any case) is the string
    written, as verl's command line reads it; a bool-typed key then names it (:func:`_check_bool`)."""
    node: Any = parsed
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict) and isinstance(node.get(leaf), bool) and text.lower() not in ("true", "false"):
        node[leaf] = text


def _take_verl(full: str, value: Any, verl: dict[str, Any], moved: Moved,
               table: verl_keys.KeyTable = verl_keys.PPO, source: str = "") -> bool:
    """Handle the key ``full`` that rlforge's schema lacks, if it is verl's (``table``): an alias puts its
    value in ``moved`` (rlforge's key -> value), a group choice its settings, a verl-only key goes to
    ``verl``; a mapping above such keys is taken leaf by leaf (also below a group choice of the same name,
    e.g. the SFT trainer's ``profiler`` block).  False when ``full`` is not verl's (an unknown key)."""
    if (target := table.alias_of(full)) is not None:
        moved.put(target, value, full, source)
        return True
    choice = table.group_choices.get(full, {})
    if isinstance(value, str) and value in choice:
        moved.update(choice[value])
        return True
    whole = full in table.verl_only and full not in table.group_choices  # a verl-only key with a mapping value
    if isinstance(value, dict) and value and table.is_verl_node(full) and not whole:
        for key, sub in value.items():
            if key not in _IGNORED_KEYS and not _take_verl(f"{full}.{key}", sub, verl, moved, table, source):
                raise ConfigError(f"unknown config key '{full}.{key}' (verl's {full} block has no such key)")
        return True
    if table.is_verl_only(full):
        verl[full] = value
        return True
    return False


def _clean(cls: type, node: dict[str, Any], prefix: str, source: str, plus: bool,
           root: type = RLForgeConfig, verl: dict[str, Any] | None = None,
           moved: Moved | None = None, table: verl_keys.KeyTable = verl_keys.PPO) -> dict[str, Any]:
    """Check ``node`` (a layer below dataclass ``cls`` at ``prefix``) against the schema.

    Renames aliases (an older spelling given as null is verl's "not set" and dropped; given beside the
    current name in one node, the older spelling wins, as verl reads it: ``warmup_style`` over
    ``lr_scheduler_type``, the SFT trainer's ``lr_scheduler`` and ``partial_pretrain``), drops Hydra
    ``_target_`` keys, wraps a scalar given for a ``list[str]`` field, takes verl's keys of ``table``
    (with ``verl`` and ``moved``; a group choice given for a schema block too, e.g. the SFT trainer's
    ``engine=fsdp``), and drops unknown keys with a warning when ``plus`` (else raises).
    """
    hints = schema.field_types(cls)
    aliases = KEY_ALIASES.get(cls, {})
    out: dict[str, Any] = {}
    older: set[str] = set()  # keys an older spelling set: it wins over the current name, as in verl
    for raw_key, value in node.items():
        key = aliases.get(str(raw_key), str(raw_key))
        if key != str(raw_key) and value is None:
            continue
        if key == str(raw_key) and key in older:
            continue
        if key != str(raw_key):
            older.add(key)
        full = f"{prefix}{key}"
        if key in _IGNORED_KEYS:
            continue
        takes = verl is not None and moved is not None
        if takes and (key not in hints or (isinstance(value, str) and full in table.group_choices)):
            assert verl is not None and moved is not None  # narrowed for the type checker
            if _take_verl(full, value, verl, moved, table, source):
                continue
        if key not in hints:
            if plus:
                shown = full + _tail(value)
                sign = "++" if source.startswith("override '++") else "+"  # as written: Hydra's add, or add-or-set
                warnings.warn(f"ignoring '{sign}{shown}': not an rlforge config key, rlforge ignores it",
                              ConfigWarning, 3)
                continue
            hint = schema.closest_key(root, full)
            command = "train" if root is RLForgeConfig else "sft"  # the two schemas this loader reads
            suggestion = f"; did you mean '{hint}'?" if hint else f"; see `rlforge {command} --print-config` for valid keys"
            where = "" if source.startswith("override") else f" in {source}"
            raise ConfigError(f"unknown config key '{full}'{where}{suggestion}")
        tp = hints[key]
        kind = schema.kind_of(tp)
        if kind == "node":
            if isinstance(value, dict):
                given = bool(value)
                value = _clean(schema.strip_optional(tp), value, f"{full}.", source, plus, root, verl, moved, table)
                if given and not value:  # every key in it was verl's (moved or set aside): not the user's block
                    continue
            elif not _is_interpolation(value):
                raise ConfigError(f"{full}: expected a mapping of sub-keys, got {value!r} (from {source})")
        elif schema.strip_optional(tp) is bool:
            _check_bool(full, value, source)
        elif schema.strip_optional(tp) == list[str] and isinstance(value, str) and not _is_interpolation(value):
            value = [value]
        elif takes and isinstance(value, dict):  # a free-form mapping: verl's aliases below it still move
            assert moved is not None
            value = _move_aliases(full, value, moved, table, source)
            if not value:
                continue
        out[key] = value
    return out


def _move_aliases(full: str, value: dict[str, Any], moved: Moved, table: verl_keys.KeyTable,
                  source: str) -> dict[str, Any]:
    """``value`` (a free-form mapping at ``full``) without its verl aliases, each put in ``moved``
    (``reward_model.reward_kwargs.overlong_buffer_cfg.len`` -> ``reward_model.overlong_buffer.len``)."""
    out: dict[str, Any] = {}
    for key, sub in value.items():
        here = f"{full}.{key}"
        if (target := table.alias_of(here)) is not None:
            moved.put(target, sub, here, source)
        elif isinstance(sub, dict):
            rest = _move_aliases(here, sub, moved, table, source)
            if rest or not sub:
                out[key] = rest
        else:
            out[key] = sub
    return out


@functools.cache
def _schema_defaults(root: type = RLForgeConfig) -> DictConfig:
    """The schema's defaults as a read-only DictConfig, built once (building it is most of a load's time)."""
    base = OmegaConf.structured(root)
    OmegaConf.set_readonly(base, True)
    return base


def _clean_layer(layer: dict[str, Any], source: str, plus: bool = False, root: type = RLForgeConfig,
                 verl: dict[str, Any] | None = None, table: verl_keys.KeyTable = verl_keys.PPO) -> dict[str, Any]:
    """``layer`` checked against ``root``; with ``verl`` (a dict to fill), verl's keys of ``table`` are taken
    (:func:`_take_verl`): aliases land on rlforge's keys (after the layer's own values), verl-only keys in
    ``verl``."""
    moved = Moved()
    out = _clean(root, layer, "", source, plus, root, verl, moved if verl is not None else None, table)
    if moved:
        check_moved(out, moved, source)
        nested: dict[str, Any] = {}
        for dotted, value in moved.items():
            node = nested
            *parents, leaf = dotted.split(".")
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        _deep_update(out, _clean(root, nested, "", source, plus, root))
    return out


def _deep_update(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _deep_update(into[key], value)
        else:
            into[key] = value


def _merge_all(layers: Sequence[_Layer | Deletion], root: type = RLForgeConfig) -> DictConfig:
    """Merge the layers onto the schema defaults in order, a ``~key`` deletion between two runs of
    them.  Each run merges in one pass (one copy of the tree); on a type error, layer by layer, so
    that the message names the layer that brought the bad value."""
    merged = _schema_defaults(root)
    run: list[_Layer] = []
    for layer in [*layers, None]:
        if isinstance(layer, _Layer):
            run.append(layer)
            continue
        if run or merged is _schema_defaults(root):
            merged = _merge_run(merged, run, root)
            run = []
        if layer is not None:
            apply_deletion(merged, layer, _schema_defaults(root))
    return merged


def _merge_run(base: DictConfig, run: list[_Layer], root: type = RLForgeConfig) -> DictConfig:
    try:
        merged = OmegaConf.merge(base, *(OmegaConf.create(layer.data) for layer in run))
    except OmegaConfBaseException:
        merged = base
        for layer in run:
            merged = _merge(merged, layer.data, layer.source, root)
    assert isinstance(merged, DictConfig)
    OmegaConf.set_readonly(merged, False)
    return merged


def load_schema(root: type, overrides: Sequence[str] = (), config_file: str | None = None,
                verl_table: verl_keys.KeyTable | None = None) -> Any:
    """The dataclass ``root`` (another entry point's schema, e.g. the SFT trainer's) built from its
    defaults <- ``config_file`` <- ``overrides``, with the same grammar and errors as :func:`load_config`
    (unknown key: one :class:`ConfigError` naming the closest key of ``root``).

    Args:
        verl_table: that entry point's verl keys (aliases, verl-only keys, group choices), taken as
            :func:`load_config` takes :data:`rlforge.config.verl_keys.PPO`; None = none.

    Returns:
        an instance of ``root`` with interpolations resolved (not validated), carrying the verl-only
        keys given (:func:`rlforge.config.user_keys.verl_values`).
    Raises:
        ConfigError: as :func:`load_config`.
    """
    layers: list[_Layer | Deletion] = []
    raw: list[tuple[dict[str, Any], str, bool]] = []
    if config_file is not None:
        raw.append((read_yaml(Path(config_file), f"config file '{config_file}'"), f"config file '{config_file}'", False))
    for override in overrides:
        raw.append((_parse_override(override), f"override '{override}'", override.lstrip().startswith("+")))
    for data, source, plus in raw:
        verl: dict[str, Any] = {}
        cleaned = _clean_layer(data, source, plus, root, verl if verl_table is not None else None,
                               verl_table or verl_keys.PPO)
        layers.append(_Layer(cleaned, source, True, verl))
    cfg = _merge_all(layers, root)
    try:
        obj = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or "?"
        raise ConfigError(f"cannot resolve config key '{key}': {first_line(e)}; set {key} to a value "
                          f"({key}=...)") from None
    assert isinstance(obj, root)  # internal invariant, not user input
    record_verl_values(obj, {k: v for layer in layers if isinstance(layer, _Layer) for k, v in layer.verl.items()})
    return obj


def _merge(cfg: DictConfig, cleaned: dict[str, Any], source: str, root: type = RLForgeConfig) -> DictConfig:
    try:
        merged = OmegaConf.merge(cfg, OmegaConf.create(cleaned))
    except OmegaConfBaseException as e:
        key = str(getattr(e, "full_key", "") or "").partition("[")[0]  # a list item's error names its list
        tp = schema.lookup(root, key) if key else None
        if tp is None:
            raise ConfigError(f"{source}: {first_line(e)}") from None
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


def _check_bool(full: str, value: Any, source: str) -> None:
    """Raises ConfigError for a value of the bool-typed key ``full`` that is not a boolean (``2``, ``1``,
    ``'yes'``), which OmegaConf would otherwise read as true (any non-zero number; yes/on/y).  None and
    interpolations are left to the merge (a non-optional key refuses null there), ``auto`` to
    :func:`rlforge.config.auto_keys.strip_auto` (a tuned key, or one error for a key without a tuner)."""
    if value is None or isinstance(value, bool) or _is_interpolation(value):
        return
    if isinstance(value, str) and value.strip().lower() in (AUTO, "true", "false"):  # OmegaConf reads the last two
        return
    raise ConfigError(f"{full}: expected bool (true or false), got {value!r} (from {source})")


def _is_interpolation(value: Any) -> bool:
    return isinstance(value, str) and "${" in value



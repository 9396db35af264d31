"""Hydra's config composition, as verl's command lines use it: ``--config-path DIR --config-name NAME``
and a YAML file's ``defaults:`` list, resolved into layers that the loader merges in order.

A file's defaults list is read as Hydra 1.1+ reads it (https://hydra.cc/docs/advanced/defaults_list/):

* ``- NAME`` (a config): ``NAME.yaml`` next to the file or on its ``hydra.searchpath``, else one of
  verl's base configs built into rlforge (``ppo_trainer``, ``ppo_megatron_trainer``:
  :mod:`rlforge.config.hydra_groups`).  A folder that is verl's own ``verl/trainer/config`` is never
  read: its files hold verl's whole schema, and rlforge's built-in groups stand for it;
* ``- GROUP@PACKAGE: OPTION`` (also ``optional``, ``override``, ``null``, a list of options,
  ``${group}`` in the option): ``GROUP/OPTION.yaml`` next to the file, else rlforge's built-in group
  of that name; an option rlforge has no engine for warns, a missing group or option is an error;
* ``- _self_``: where the file's own keys go (at the end when the list has no ``_self_``).

``override`` entries replace the option of the matching group default wherever it was listed;
an ``override`` that matches nothing is an error, as in Hydra.  Every error is one line naming the
file, the line of the entry and the cause (:class:`~rlforge.errors.ConfigError`).

Deviations: an entry without ``@PACKAGE`` for one of verl's groups lands where verl's own
``ppo_trainer.yaml`` puts that group (``actor`` -> ``actor_rollout_ref.actor``), not at a root key
``actor`` that rlforge's schema does not have; ``pkg://`` search paths are not searched; Hydra's
runtime settings (``hydra.run``, ``hydra.job``, ...) are ignored with a warning.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from rlforge.config.hydra_groups import GLOBAL_PACKAGE, GROUPS, base_config, is_verl_config_dir
from rlforge.config.yaml_file import ConfigWarning, read_yaml
from rlforge.errors import ConfigError


class ComposedLayer(NamedTuple):
    """One layer of a composed config: keys in the config's tree shape, where they came from (for
    messages), and whether the user wrote them (a file's own keys) or rlforge's built-in groups did."""

    data: dict[str, Any]
    source: str
    from_user: bool


@dataclass(frozen=True)
class _Entry:
    """One item of a defaults list."""

    text: str
    """The entry as written (``override model_engine: megatron``), for messages."""
    where: str
    """``config file 'x.yaml', line 3`` or ``verl's ppo_trainer``."""
    kind: str
    """``self`` | ``config`` | ``group``."""
    name: str = ""
    """The config's name, or the group's path."""
    package: str | None = None
    """Absolute dotted package; ``""`` = the root; None = the group's own."""
    options: tuple[str, ...] = ()
    override: bool = False
    optional: bool = False
    folder: Path | None = None
    """The listing file's folder (None for rlforge's built-in configs)."""


BUILTIN_FILES = ("fully_async_ppo_trainer", "fully_async_ppo_megatron_trainer", "one_step_off_ppo_trainer",
                 "one_step_off_ppo_megatron_trainer")
"""verl's experimental trainers' configs that rlforge ships (``rlforge/config/verl_files/``), for their scripts'
``--config-path=config --config-name=NAME``: their keys and values over verl's ``ppo_trainer``."""


def builtin_file(name: str) -> Path | None:
    """The shipped YAML file of :data:`BUILTIN_FILES` ``name``; None for another name."""
    if name not in BUILTIN_FILES:
        return None
    from importlib import resources

    return Path(str(resources.files("rlforge.config") / "verl_files" / f"{name}.yaml"))


def compose_named(config_path: str | None, config_name: str | None) -> list[ComposedLayer]:
    """The layers of ``--config-path config_path --config-name config_name`` (Hydra's flags).

    ``config_path`` is read from the current directory (None = it); ``config_name`` may end in
    ``.yaml`` (None = verl's ``ppo_trainer``).  When ``config_path/config_name.yaml`` is no file, or
    the folder is verl's own ``verl/trainer/config``, the name may be one of verl's base configs
    (``ppo_trainer``, ``ppo_megatron_trainer``), as for ``verl.trainer.main_ppo --config-path=config``.

    Raises:
        ConfigError: one line: no such file and no such built-in config; any error of the file.
    """
    name = (config_name or "ppo_trainer").strip().removesuffix(".yaml")
    folder = Path(config_path or ".").expanduser()
    path = folder / f"{name}.yaml"
    composer = _Composer([folder])
    if path.is_file() and not is_verl_config_dir(folder):
        composer.add_file(path, f"config file '{path}'", "")
    elif base_config(name) is not None:
        composer.add_builtin(name)
    elif (builtin := builtin_file(name)) is not None:
        composer.add_file(builtin, f"verl's {name} (rlforge's copy, {builtin})", "")
    else:
        raise ConfigError(f"--config-name {config_name or name}: no file {path} (--config-path is read from the "
                          f"current directory, {Path.cwd()}), and rlforge's built-in configs are verl's "
                          f"ppo_trainer, ppo_megatron_trainer, {', '.join(BUILTIN_FILES)}")
    return composer.finish()


def compose_file(path: Path, source: str) -> list[ComposedLayer]:
    """The layers of the YAML file ``path`` (``--config FILE``): its defaults list resolved, then its
    own keys where ``_self_`` says.  Raises :class:`ConfigError` (one line) as :func:`compose_named`."""
    composer = _Composer([path.parent])
    composer.add_file(path, source, "")
    return composer.finish()


class _Composer:
    """Collects a config tree's entries in order, then resolves the group options (:meth:`finish`)."""

    def __init__(self, search: list[Path]) -> None:
        self.search = list(search)
        self.items: list[_Entry | ComposedLayer] = []
        self.overrides: list[_Entry] = []
        self.warned: set[str] = set()

    def add_file(self, path: Path, source: str, package: str) -> None:
        """The file's defaults list and its own keys (at ``package``) into the tree."""
        data = read_yaml(path, source)
        defaults = data.pop("defaults", None)
        self._read_hydra_block(data.pop("hydra", None), source)
        own = ComposedLayer(_nest(package, data), source, True) if data else None
        if defaults is None:
            defaults = []
        if not isinstance(defaults, list):
            raise ConfigError(f"{source}, line {_defaults_line(path)}: 'defaults' must be a list of entries "
                              "(- name, - group: option, - _self_)")
        lines = _entry_lines(path)
        entries = [_parse_entry(raw, f"{source}, line {lines[i] if i < len(lines) else '?'}", path.parent, package)
                   for i, raw in enumerate(defaults)]
        self._add_list(entries, own)

    def add_builtin(self, name: str) -> None:
        """verl's base config ``name`` (its values are rlforge's schema defaults)."""
        raw_list = base_config(name) or []
        self._add_list([_parse_entry(raw, f"verl's {name}", None, "") for raw in raw_list], None)

    def _add_list(self, entries: list[_Entry], own: ComposedLayer | None) -> None:
        placed = False
        for entry in entries:
            if entry.kind == "self":
                placed = True
                if own is not None:
                    self.items.append(own)
            elif entry.override:
                self.overrides.append(entry)
            elif entry.kind == "config":
                self._add_config(entry)
            else:
                self.items.append(entry)
        if not placed and own is not None:
            self.items.append(own)

    def _add_config(self, entry: _Entry) -> None:
        path = self._find(entry.folder, f"{entry.name}.yaml")
        if path is not None:
            self.add_file(path, f"config file '{path}'", _file_package(path, entry.package, ""))
        elif base_config(entry.name) is not None:
            self.add_builtin(entry.name)
        elif not entry.optional:
            raise ConfigError(f"{entry.where}: defaults entry '{entry.text}': no config '{entry.name}' "
                              f"({entry.name}.yaml) in {_folders(entry.folder, self.search)}, and rlforge's "
                              "built-in configs are verl's ppo_trainer and ppo_megatron_trainer")

    def _find(self, folder: Path | None, relative: str) -> Path | None:
        for base in ([folder] if folder is not None else []) + self.search:
            if not is_verl_config_dir(base) and (base / relative).is_file():
                return base / relative
        return None

    def _read_hydra_block(self, block: Any, source: str) -> None:
        if not isinstance(block, dict):
            return
        for item in block.pop("searchpath", None) or []:
            text = str(item)
            if text.startswith("file://"):
                self.search.append(Path(text.removeprefix("file://")).expanduser())
        if block:
            warnings.warn(f"{source}: ignoring hydra.{', hydra.'.join(map(str, block))}: rlforge does not use "
                          "Hydra's runtime settings", ConfigWarning, 4)

    def finish(self) -> list[ComposedLayer]:
        """The layers in order: group options after ``override`` entries and ``${group}`` choices."""
        entries = [self._overridden(item) if isinstance(item, _Entry) else item for item in self.items]
        for override in self.overrides:
            if not any(isinstance(e, _Entry) and _matches(override, e) for e in entries):
                raise ConfigError(f"{override.where}: defaults entry '{override.text}': no '{override.name}' "
                                  "in the defaults list to override; list it without 'override'")
        choices = {e.name: e.options[-1] for e in entries if isinstance(e, _Entry) and len(e.options) == 1}
        out: list[ComposedLayer] = []
        for item in entries:
            out += self._resolve(item, choices) if isinstance(item, _Entry) else [item]
        return out

    def _overridden(self, entry: _Entry) -> _Entry:
        for override in self.overrides:
            if _matches(override, entry):
                entry = replace(entry, options=override.options, where=override.where, text=override.text)
        return entry

    def _resolve(self, entry: _Entry, choices: dict[str, str]) -> list[ComposedLayer]:
        out: list[ComposedLayer] = []
        for option in entry.options:
            option = _interpolate(option, choices, entry)
            path = self._find(entry.folder, f"{entry.name}/{option}.yaml")
            if path is not None:
                sub = _Composer(self.search)
                default = entry.name.replace("/", ".")
                sub.add_file(path, f"config file '{path}'", _file_package(path, entry.package, default))
                out += sub.finish()
            else:
                out += self._builtin_option(entry, option)
        return out

    def _builtin_option(self, entry: _Entry, option: str) -> list[ComposedLayer]:
        group = GROUPS.get(entry.name.rpartition("/")[2])
        if group is None or option not in group.options:
            if entry.optional:
                return []
            folders = _folders(entry.folder, self.search)
            if group is None:
                raise ConfigError(f"{entry.where}: defaults entry '{entry.text}': no config group '{entry.name}' "
                                  f"(no folder {entry.name}/ in {folders}, and verl has no such group)")
            raise ConfigError(f"{entry.where}: defaults entry '{entry.text}': group '{entry.name}' has no option "
                              f"'{option}' (no {entry.name}/{option}.yaml in {folders}; verl's options: "
                              f"{', '.join(group.options)})")
        chosen = group.options[option]
        if chosen.unsupported and chosen.unsupported not in self.warned:
            self.warned.add(chosen.unsupported)
            warnings.warn(f"{entry.where}: defaults entry '{entry.text}' ({option}): {chosen.unsupported}",
                          ConfigWarning, 5)
        if not chosen.layer:
            return []
        package = group.package if entry.package is None else entry.package
        return [ComposedLayer(_nest(package, dict(chosen.layer)), f"defaults entry '{entry.text}' ({entry.where})",
                              False)]


def _matches(override: _Entry, entry: _Entry) -> bool:
    return override.name == entry.name and override.package in (None, entry.package)


def _interpolate(option: str, choices: dict[str, str], entry: _Entry) -> str:
    def value(match: re.Match[str]) -> str:
        if match.group(1) not in choices:
            raise ConfigError(f"{entry.where}: defaults entry '{entry.text}': '${{{match.group(1)}}}' names no "
                              "group chosen in the defaults list")
        return choices[match.group(1)]

    return re.sub(r"\$\{([^}]+)\}", value, option)


def _parse_entry(raw: Any, where: str, folder: Path | None, parent: str) -> _Entry:
    """One raw defaults item (a string or a one-key mapping) as an :class:`_Entry`."""
    if isinstance(raw, str) and raw.strip() == "_self_":
        return _Entry("_self_", where, "self")
    if isinstance(raw, str):
        key, options, text = raw.strip(), None, raw.strip()
    elif isinstance(raw, dict) and len(raw) == 1:
        ((key, options),) = raw.items()
        key = str(key).strip()
        text = f"{key}: {options}"
    else:
        raise ConfigError(f"{where}: defaults entry {raw!r} is neither a config name nor 'group: option'")
    words = key.split()
    flags, key = set(words[:-1]), words[-1] if words else ""
    if not key or not flags <= {"override", "optional"}:
        raise ConfigError(f"{where}: defaults entry '{text}': expected [optional|override] group@package: option")
    name, _, package = key.partition("@")
    name = name.lstrip("/")
    while name.startswith("../"):
        name = name[3:]
    kind = "group"
    if options is None and isinstance(raw, str):
        name, _, option = name.rpartition("/")
        kind, name, options = ("config", option, None) if not name else ("group", name, option)
    option_list = _options(options, where, text)
    return _Entry(text, where, kind, name, _join(parent, package) if package else None, option_list,
                  "override" in flags, "optional" in flags, folder)


def _options(options: Any, where: str, text: str) -> tuple[str, ...]:
    if options is None:
        return ()
    if isinstance(options, list) and all(isinstance(o, str) for o in options):
        return tuple(options)
    if isinstance(options, str):
        return (options,)
    raise ConfigError(f"{where}: defaults entry '{text}': the option must be a config name, a list of names or null")


def _join(parent: str, package: str) -> str:
    """Hydra's package ``package`` of an entry in a config at ``parent`` as an absolute dotted path."""
    if package == GLOBAL_PACKAGE or package.startswith(GLOBAL_PACKAGE + "."):
        return package.removeprefix(GLOBAL_PACKAGE).lstrip(".")
    return f"{parent}.{package}" if parent else package


def _file_package(path: Path, given: str | None, default: str) -> str:
    """Where a loaded file's keys land: the entry's ``@package``, else the file's ``# @package``
    header, else ``default`` (the group's path; the root for a plain config)."""
    if given is not None:
        return given
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        header = re.match(r"#\s*@package\s+(\S+)", line.strip())
        if header:
            return _join("", header.group(1))
        if line.strip() and not line.lstrip().startswith("#"):
            break
    return default


def _nest(package: str, data: dict[str, Any]) -> dict[str, Any]:
    for part in reversed([p for p in package.split(".") if p]):
        data = {part: data}
    return data


def _folders(folder: Path | None, search: list[Path]) -> str:
    seen = list(dict.fromkeys(str(p) for p in ([folder] if folder is not None else []) + search))
    return ", ".join(seen) if seen else "no folder"


def _root_node(path: Path) -> Any:
    try:
        return yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, yaml.YAMLError):
        return None


def _defaults_value(path: Path) -> tuple[Any, Any]:
    root = _root_node(path)
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if getattr(key, "value", None) == "defaults":
                return key, value
    return None, None


def _entry_lines(path: Path) -> list[int]:
    """The 1-based line of each item of ``path``'s defaults list."""
    _, value = _defaults_value(path)
    return [item.start_mark.line + 1 for item in value.value] if isinstance(value, yaml.SequenceNode) else []


def _defaults_line(path: Path) -> int | str:
    key, _ = _defaults_value(path)
    return key.start_mark.line + 1 if key is not None else "?"

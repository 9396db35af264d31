"""Reading a YAML config file: its mapping, or one :class:`ConfigError` line naming the file, the
line and column, and the cause (no traceback).  Shared by the loader (jobs, ``--config``) and the
Hydra composition (:mod:`rlforge.config.hydra_compose`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf

from rlforge.errors import ConfigError, RLForgeWarning


class ConfigWarning(RLForgeWarning):
    """A config key or entry was accepted but has no effect (unknown ``+key``, ``~key`` with nothing to
    delete, a Hydra ``defaults`` option rlforge has no engine for, ignored Hydra metadata)."""


def read_yaml(path: Path, source: str) -> dict[str, Any]:
    """The top-level mapping of the YAML file ``path``, interpolations unresolved.

    Raises:
        ConfigError: ``source``: file not found, unreadable, not valid YAML (with line and column),
            or not a mapping at the top level.
    """
    try:
        loaded = OmegaConf.load(path)
    except FileNotFoundError:
        raise ConfigError(f"{source}: file not found; check the path given to --config") from None
    except OSError as e:
        raise ConfigError(f"{source}: cannot read it: {first_line(e)}") from None
    except yaml.MarkedYAMLError as e:
        raise ConfigError(yaml_error_message(e, source)) from None
    except Exception as e:  # yaml.YAMLError and OmegaConf's errors share no base class
        raise ConfigError(f"{source}: not valid YAML: {one_line(e)}") from None
    if not isinstance(loaded, DictConfig):
        raise ConfigError(f"{source}: expected a mapping of config keys at the top level, got a list")
    data = OmegaConf.to_container(loaded, resolve=False)
    assert isinstance(data, dict)
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


def one_line(e: BaseException) -> str:
    """The whole message of ``e`` on one line."""
    return " ".join(str(e).split()) or type(e).__name__


def first_line(e: BaseException) -> str:
    """The first line of ``e``'s message (its type's name when empty)."""
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__

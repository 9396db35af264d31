"""Runs the entries of ``tests/fixtures/verl_examples.json`` through ``rlforge check-config``'s loader
(:func:`rlforge.config.check.check_config`), with the lists of expected refusals kept in
``tests/config/test_verl_examples.py``.  Shared by the test and by ``python tests/verl_examples_harness.py``
(prints the counts)."""

from __future__ import annotations

import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlforge.config.check import check_config
from rlforge.errors import ConfigError

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "verl_examples.json"
_UNKNOWN = re.compile(r"unknown config key '([^']+)'")


def load_fixture() -> dict[str, dict[str, Any]]:
    """``{script: entry}`` of the fixture."""
    return json.loads(FIXTURE.read_text())["scripts"]


@dataclass
class Outcome:
    """How one entry fared: ``error`` (None = accepted) after the pending keys were set aside
    (``pending_unknown``: unknown keys re-sent as ``++key``; ``pending_values``: overrides dropped)."""

    error: str | None
    first_error: str | None
    pending_unknown: list[str] = field(default_factory=list)
    pending_values: list[str] = field(default_factory=list)


def _key(override: str) -> str:
    return override.lstrip("+~").partition("=")[0].strip()


def _under(key: str, node: str) -> bool:
    return key == node or key.startswith(node + ".")


def _drop(tree: dict[str, Any], dotted: str) -> None:
    node: Any = tree
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(last, None)


def run_entry(entry: dict[str, Any], pending_unknown: set[str], pending_values: set[str],
              folder: Path | None = None) -> Outcome:
    """Check ``entry``; an unknown key of ``pending_unknown`` is re-sent as ``++key`` (ignored with a
    warning) and a refused value of a key in ``pending_values`` dropped, and the check runs again,
    so that what follows them is checked too.  ``folder``: where an entry's config file is written."""
    overrides = list(entry["overrides"])
    tree = json.loads(json.dumps(entry.get("config_file_keys") or {}))
    out = Outcome(None, None)
    folder = folder or Path(tempfile.mkdtemp())
    for _ in range(64):
        path, name = entry["config_path"], entry["config_name"]
        if path == "<config_file>":
            (folder / f"{name}.yaml").write_text(yaml.safe_dump(tree, sort_keys=False))
            path = str(folder)
        try:
            check_config(overrides, config_path=path, config_name=name)
            out.error = None
            return out
        except ConfigError as e:
            message = str(e)
        out.first_error = out.first_error or message
        out.error = message
        unknown = _UNKNOWN.match(message)
        if unknown and unknown.group(1) in pending_unknown:
            node = unknown.group(1)
            out.pending_unknown.append(node)
            overrides = ["++" + o.lstrip("+") if _under(_key(o), node) else o for o in overrides]
            _drop(tree, node)
            continue
        value_key = next((k for k in pending_values if message.startswith(k + "=")), None)
        if value_key is not None:
            out.pending_values.append(value_key)
            overrides = [o for o in overrides if _key(o) != value_key]
            _drop(tree, value_key)
            continue
        return out
    raise AssertionError(f"entry did not settle: {out}")


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "config"))
    from test_verl_examples import PENDING_REFUSED_VALUES, PENDING_UNKNOWN_KEYS

    entries = load_fixture()
    outcomes = {s: run_entry(e, set(PENDING_UNKNOWN_KEYS), set(PENDING_REFUSED_VALUES)) for s, e in entries.items()}
    outright = sum(o.first_error is None for o in outcomes.values())
    no_unknown = sum(o.error is None and not o.pending_values for o in outcomes.values())
    settled = sum(o.error is None for o in outcomes.values())
    print(f"accepted {outright} of {len(entries)} as they are; {no_unknown} with pending unknown keys set aside; "
          f"{settled} with pending refused values set aside too")
    for script, o in outcomes.items():
        if o.error is not None:
            print(f"{script}: {o.error}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``rlforge check-config``: what rlforge does with each key a verl command line sets.

The config is loaded and validated exactly as ``python -m rlforge.trainer.main_ppo --print-config``
does (:func:`rlforge.config.load_config`, :func:`rlforge.config.validate_config`), without torch.
Each key the user set (an override's leaves, a ``--config``/``--config-name`` file's leaves) gets one
verdict:

* ``takes effect``: rlforge reads it, under verl's name;
* ``mapped -> KEY``: a verl name that sets rlforge's ``KEY`` (an older spelling,
  :data:`rlforge.config.loader.KEY_ALIASES`, or :data:`rlforge.config.verl_keys.ALIASES`);
* ``warned (WHY)``: accepted, and a warning line names it (``config/later_work.py``, a value rlforge
  replaces, a ``+key`` that rlforge does not have);
* ``auto (tuned)``: set to ``auto`` (on the command line or in a file): handed to the tuner
  (:mod:`rlforge.config.auto_keys`).

A refused key or value raises :class:`~rlforge.errors.ConfigError` (one line), as a run would.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from omegaconf import OmegaConf

from rlforge.config import verl_keys
from rlforge.config.auto_keys import auto_keys
from rlforge.config.loader import _canonical_key, load_config
from rlforge.config.user_keys import leaf_keys, user_keys
from rlforge.config.validate import validate_config
from rlforge.config.yaml_file import ConfigWarning
from rlforge.errors import RLForgeWarning

TAKES_EFFECT, MAPPED, WARNED, AUTO = "takes effect", "mapped", "warned", "auto"
VERDICTS = (TAKES_EFFECT, MAPPED, WARNED, AUTO)
"""Every verdict, in the order the summary line counts them."""

TUNED = ("tuned: rlforge train chooses it for the GPU at start, `rlforge tune` shows the plan; on a CPU it keeps "
         "its default")


@dataclass(frozen=True)
class KeyVerdict:
    """What rlforge does with one key the user set.

    Attributes:
        key: the dotted key as the user wrote it (``+``/``++`` dropped).
        verdict: :data:`TAKES_EFFECT`, :data:`MAPPED`, :data:`WARNED` or :data:`AUTO`.
        detail: the key it maps to (``mapped``), the warning lines, joined by ``"; "`` (``warned``), or
            what the tuner does (``auto``).
    """

    key: str
    verdict: str
    detail: str = ""

    def line(self) -> str:
        """``key: takes effect`` / ``key: mapped -> our.key`` / ``key: warned (why)``."""
        if self.verdict == MAPPED:
            return f"{self.key}: mapped -> {self.detail}"
        if self.verdict in (WARNED, AUTO):
            return f"{self.key}: {self.verdict} ({self.detail})"
        return f"{self.key}: {self.verdict}"


@dataclass(frozen=True)
class CheckReport:
    """Per-key verdicts in the order the keys were given, and the warnings no key of the user names."""

    keys: list[KeyVerdict]
    other_warnings: list[str]


def check_config(overrides: Sequence[str] = (), config_file: str | None = None, job: str | None = None,
                 config_path: str | None = None, config_name: str | None = None) -> CheckReport:
    """Load and validate as a run does; return each user key's verdict.

    Args: as :func:`rlforge.config.load_config` (``job`` None: verl's defaults, as ``main_ppo``).
    Raises:
        ConfigError: the one-line error a run would stop with (unknown key, refused value, ...).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(list(overrides), config_file=config_file, job=job, config_path=config_path,
                          config_name=config_name)
        lines = validate_config(cfg)
    lines += [str(w.message) for w in caught
              if issubclass(w.category, ConfigWarning | RLForgeWarning) and str(w.message) not in lines]
    written = _written_keys(overrides)
    autos = auto_keys(cfg)
    recorded = (user_keys(cfg) or frozenset()) | autos  # a file's `auto` leaves are not in its recorded keys
    keys = written + sorted(k for k in recorded if k not in {verl_keys.alias_of(w) or _canonical_key(w) for w in written})
    used: set[str] = set()
    verdicts = []
    for key in dict.fromkeys(keys):
        canonical = verl_keys.alias_of(key) or _canonical_key(key)
        # a verl alias: only warnings that name it in full (its parent may be a warned free-form block)
        why = [w for w in lines if (_names(w, key) if canonical == key else _names_exactly(w, key))]
        used.update(why)
        if canonical in autos:
            verdicts.append(KeyVerdict(key, AUTO, TUNED))
        elif why:
            verdicts.append(KeyVerdict(key, WARNED, "; ".join(why)))
        elif canonical != key:
            verdicts.append(KeyVerdict(key, MAPPED, canonical))
        else:
            verdicts.append(KeyVerdict(key, TAKES_EFFECT))
    return CheckReport(verdicts, [w for w in lines if w not in used])


def _written_keys(overrides: Sequence[str]) -> list[str]:
    """The dotted leaf keys of ``overrides`` as written (``a={b:1}`` -> ``a.b``), deletions included."""
    out: list[str] = []
    for text in overrides:
        body = text.strip().lstrip("+~")
        key, sep, _ = body.partition("=")
        if not sep:
            out.append(key.strip())
            continue
        try:
            tree = OmegaConf.to_container(OmegaConf.from_dotlist([body]), resolve=False)
        except Exception:  # load_config already parsed it; keep the key as written
            out.append(key.strip())
            continue
        assert isinstance(tree, dict)
        out += sorted(leaf_keys(tree))
    return out


def _names_exactly(line: str, key: str) -> bool:
    """Whether the warning ``line`` names ``key`` itself."""
    return re.search(rf"(?<![\w.]){re.escape(key)}(?![\w.])", line) is not None


def _names(line: str, key: str) -> bool:
    """Whether the warning ``line`` names ``key`` or a node above it (``a.b`` for ``a.b.c``)."""
    parts = key.split(".")
    for n in range(len(parts), 0 if len(parts) == 1 else 1, -1):  # a top-level key (model_engine) by itself
        if re.search(rf"(?<![\w.]){re.escape('.'.join(parts[:n]))}(?![\w.])", line):
            return True
    return False

"""What a run shows of warnings: rlforge's own, once each; other libraries' only under ``--verbose``.

``rlforge train`` (and ``python -m rlforge.trainer.main_ppo``) installs a :class:`WarningPrinter` as
``warnings.showwarning``:

* a warning of category :class:`~rlforge.errors.RLForgeWarning` (rlforge's: about a key the user set,
  or a value rlforge chose that changes behaviour) is printed as ``rlforge: warning: MESSAGE``, once
  per run however often it is raised;
* any other warning (torch's, transformers', peft's deprecation notes, such as FSDP1's
  ``state_dict_type`` FutureWarning) is dropped, or, with ``--verbose``, printed once as
  ``rlforge: library warning: Category: MESSAGE (file:line)`` (the first place it came from);
* under a launcher (``WORLD_SIZE`` set) only rank 0 prints, and the config's warnings, which the
  user's own process printed before it launched the workers, are not printed again by them.

Without ``--verbose`` the torch profiler's kineto library is also told to stay quiet
(``KINETO_LOG_LEVEL``, read once when torch loads): it would print ``profiler_start`` /
``profiler_stop`` lines at every profiled step (``trainer.profile_steps``).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterable
from typing import Any, TextIO

from rlforge.errors import RLForgeWarning
from rlforge.trainer.summary import START_ENV

QUIET_ENV = {"KINETO_LOG_LEVEL": "6"}
"""Environment set (unless already set, and unless ``--verbose``) before torch loads: kineto's log
levels run from 0 (verbose) to 5 (its ``profiler_start``/``profiler_stop`` lines); 6 prints none."""


def prints_here() -> bool:
    """False on the ranks other than 0 of a launched run (``WORLD_SIZE`` and ``RANK`` set)."""
    return "WORLD_SIZE" not in os.environ or (os.environ.get("RANK", "0") or "0") == "0"


def launched_by_rlforge() -> bool:
    """True in a worker that ``rlforge train`` launched (the user's process printed the start line
    and the config's warnings)."""
    return "WORLD_SIZE" in os.environ and bool(os.environ.get(START_ENV))


class WarningPrinter:
    """Prints warnings once each: :meth:`warn` for rlforge's lines, :meth:`showwarning` for
    ``warnings.warn`` (the signature of ``warnings.showwarning``).

    Args:
        verbose: also print other libraries' warnings (once each).
        stream: where to print; None = ``sys.stderr`` at the time of printing (it may be replaced).
    """

    def __init__(self, verbose: bool = False, stream: TextIO | None = None) -> None:
        self.verbose = verbose
        self.stream = stream
        self._seen: set[str] = set()

    def _print(self, line: str, key: str | None = None) -> None:
        """Print ``line`` unless ``key`` (default: the line) was printed before."""
        key = line if key is None else key
        if key in self._seen or not prints_here():
            return
        self._seen.add(key)
        print(line, file=self.stream or sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        """Print ``rlforge: warning: message`` unless it was printed before."""
        self._print(f"rlforge: warning: {message}")

    def showwarning(self, message: Any, category: type[Warning], filename: str, lineno: int,
                    file: TextIO | None = None, line: str | None = None) -> None:
        """rlforge's warnings as :meth:`warn` lines; other libraries' only when ``verbose``."""
        if issubclass(category, RLForgeWarning):
            self.warn(str(message))
        elif self.verbose:
            text = f"rlforge: library warning: {category.__name__}: {message}"
            self._print(f"{text} ({filename}:{lineno})", text)  # once, wherever else it is raised from


def install(verbose: bool = False) -> WarningPrinter:
    """A new :class:`WarningPrinter` as ``warnings.showwarning``; unless ``verbose``, the
    :data:`QUIET_ENV` variables not set yet (call before torch is imported)."""
    printer = WarningPrinter(verbose)
    warnings.showwarning = printer.showwarning
    if not verbose:
        for name, value in QUIET_ENV.items():
            os.environ.setdefault(name, value)
    return printer


def installed() -> WarningPrinter | None:
    """The :class:`WarningPrinter` that :func:`install` made ``warnings.showwarning``, if it still is."""
    owner = getattr(warnings.showwarning, "__self__", None)
    return owner if isinstance(owner, WarningPrinter) else None


def show_config_warnings(lines: Iterable[str]) -> None:
    """Print the config's warnings (:func:`rlforge.config.validate_config`'s lines), once each, through
    the installed printer (a plain one if none is), except in a worker that ``rlforge train`` launched."""
    if launched_by_rlforge():
        return
    printer = installed() or WarningPrinter()
    for line in lines:
        printer.warn(line)

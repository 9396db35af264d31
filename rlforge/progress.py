"""Progress bars that show only on a terminal.

A tqdm bar redraws itself with carriage returns; in a log file or a pipe those frames pile up
on one line.  :func:`progress_bar` is tqdm's bar when both stdout and stderr are terminals
and a disabled (silent) bar otherwise, so a redirected run prints only its plain lines
(the start line, one line per step, the summary).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from tqdm.auto import tqdm


def interactive() -> bool:
    """True when stdout and stderr are both terminals (``isatty``)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is None or not stream.isatty():
                return False
        except (AttributeError, ValueError):  # a replaced stream without isatty, or a closed one
            return False
    return True


def progress_bar(iterable: Iterable[Any] | None = None, *, disable: bool = False, **kwargs: Any) -> tqdm:
    """``tqdm(iterable, **kwargs)``, disabled when ``disable`` or when not :func:`interactive`."""
    return tqdm(iterable, disable=disable or not interactive(), **kwargs)

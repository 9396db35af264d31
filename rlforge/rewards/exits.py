"""A reward function that tries to end the process (``sys.exit``, ``raise KeyboardInterrupt``).

``SystemExit`` and ``KeyboardInterrupt`` are not :class:`Exception`, so a plain ``except Exception``
around the user's call lets them through: ``sys.exit(0)`` inside a reward function used to end
``rlforge train`` with status 0, no step done and an empty ``metrics.jsonl``.  The reward managers
turn them into a :class:`~rlforge.errors.RewardError` that names the function and the sample,
and stop the run (the function is broken, not flaky: no ``failure_score`` for these).

A real Ctrl-C of the trainer is still a Ctrl-C: while the user's function runs in the trainer's
main thread, :class:`SigintWatch` notes whether SIGINT was delivered, and a ``KeyboardInterrupt``
that follows one is re-raised as it is.  (Scorer worker processes ignore SIGINT, so there any
``KeyboardInterrupt`` comes from user code.)
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from rlforge.errors import RewardError

USER_EXITS: tuple[type[BaseException], ...] = (SystemExit, KeyboardInterrupt)
"""Exceptions that a reward function may raise to end the process; never a sample's ordinary error."""


def exit_reason(e: BaseException) -> str:
    """What the function did, in words: ``called sys.exit(0) (SystemExit)`` or ``raised KeyboardInterrupt``."""
    if isinstance(e, SystemExit):
        return f"called sys.exit({e.code!r}) (SystemExit)"
    return f"raised {type(e).__name__}" + (f": {e}" if str(e) else "")


def exit_error(where: str, reason: str) -> RewardError:
    """The one-line error for a function that tried to end the process; ``where`` names the
    function and the sample (:func:`rlforge.rewards.custom.sample_where`), ``reason`` is
    :func:`exit_reason`."""
    return RewardError(
        f"{where} {reason}; a reward function must return a score, not end the process "
        "(fix the function; the run stops here)"
    )


class SigintWatch:
    """Context manager: :attr:`seen` is True when SIGINT reached this process inside the block.

    Only in the main thread (where Python runs signal handlers) and only when the current SIGINT
    handler is a Python callable (it is called as before, so Ctrl-C still raises
    ``KeyboardInterrupt``); elsewhere :attr:`seen` stays False.  The previous handler is restored
    on exit.
    """

    def __init__(self) -> None:
        self.seen = False
        self._prev: Any = None
        self._installed = False

    def _on_sigint(self, signum: int, frame: FrameType | None) -> Any:
        self.seen = True
        return self._prev(signum, frame)

    def __enter__(self) -> SigintWatch:
        if threading.current_thread() is threading.main_thread():
            prev = signal.getsignal(signal.SIGINT)
            if callable(prev):
                self._prev = prev
                signal.signal(signal.SIGINT, self._on_sigint)
                self._installed = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._prev)
            self._installed = False

    def is_user_exit(self, e: BaseException) -> bool:
        """True when ``e`` came from user code: a ``SystemExit``, or a ``KeyboardInterrupt`` with no
        SIGINT seen in the block."""
        return isinstance(e, SystemExit) or (isinstance(e, KeyboardInterrupt) and not self.seen)

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

import os
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

from rlforge.errors import RewardError

USER_EXITS: tuple[type[BaseException], ...] = (SystemExit, KeyboardInterrupt)
"""Exceptions that a reward function may raise to end the process; never a sample's ordinary error."""


class OsExit(SystemExit):
    """``os._exit(code)`` called by a reward function inside :class:`SigintWatch` (which replaces ``os._exit``
    there): it would end the trainer at once, with that status and no message (``os._exit(0)``: status 0)."""


_REAL_OS_EXIT = os._exit
_guard_lock = threading.Lock()
_guard_depth = 0
_guard_pid = 0


def _raising_os_exit(code: int) -> None:
    if os.getpid() != _guard_pid:  # a child forked meanwhile (a scorer pool's worker): its own exit
        _REAL_OS_EXIT(code)
    raise OsExit(code)


def _guard_os_exit(on: bool) -> None:
    """Replace ``os._exit`` by :func:`_raising_os_exit` while at least one watch is open (any thread)."""
    global _guard_depth, _guard_pid
    with _guard_lock:
        _guard_depth += 1 if on else -1
        if on and _guard_depth == 1:
            _guard_pid = os.getpid()
            os._exit = _raising_os_exit
        elif not on and _guard_depth == 0:
            os._exit = _REAL_OS_EXIT


def exit_reason(e: BaseException) -> str:
    """What the function did, in words: ``called sys.exit(0) (SystemExit)``, ``called os._exit(0)`` or
    ``raised KeyboardInterrupt``."""
    if isinstance(e, OsExit):
        return f"called os._exit({e.code!r})"
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

    Inside the block ``os._exit(code)`` raises :class:`OsExit` (a ``SystemExit``) instead of ending the
    process at once: a reward function calling it used to end ``rlforge train`` with status 0 and no message.

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
        _guard_os_exit(True)
        if threading.current_thread() is threading.main_thread():
            prev = signal.getsignal(signal.SIGINT)
            if callable(prev):
                self._prev = prev
                signal.signal(signal.SIGINT, self._on_sigint)
                self._installed = True
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        _guard_os_exit(False)
        if self._installed:
            signal.signal(signal.SIGINT, self._prev)
            self._installed = False

    def is_user_exit(self, e: BaseException) -> bool:
        """True when ``e`` came from user code: a ``SystemExit``, or a ``KeyboardInterrupt`` with no
        SIGINT seen in the block."""
        return isinstance(e, SystemExit) or (isinstance(e, KeyboardInterrupt) and not self.seen)

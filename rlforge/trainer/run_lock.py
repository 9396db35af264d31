"""One run per run folder: ``<trainer.default_local_dir>/.rlforge.lock``.

A run takes the lock at its start (rank 0 only in a multi-process run) and releases it at its
end, also when it fails.  The lock file is JSON, ``{"pid": int, "host": str, "started": float
(Unix seconds)}``; it is created atomically (``O_CREAT | O_EXCL``), so of two runs that start
together exactly one gets it.  While it is held, a second run in the same folder either fails
with one message naming the folder, the holder and the fix (``trainer.on_existing_run=error``,
the default) or writes into a fresh sub-folder ``run-<id>`` of it instead
(``trainer.on_existing_run=append``).  A lock left by a process that died (same host, PID no
longer alive) is taken over with a warning; take-overs hold an exclusive ``flock`` on the folder and
re-read the lock inside it, so of several runs that find the same dead lock only one replaces it.  A lock held from another host is always respected:
whether that process lives cannot be checked from here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlforge.errors import ConfigError

LOCK_FILE = ".rlforge.lock"
ON_EXISTING_RUN = ("error", "append")
"""The values of ``trainer.on_existing_run``."""

log = logging.getLogger(__name__)


def _pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this host (signal 0 probes without signalling)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


def read_holder(path: Path) -> dict[str, Any] | None:
    """The lock file's JSON (``pid``, ``host``, ``started``), or None when absent; an unreadable
    or half-written file reads as ``{}`` (a holder of unknown PID and host)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _stale(holder: dict[str, Any]) -> bool:
    """A lock whose process is known dead: written on this host by a PID that no longer runs."""
    if holder.get("host") != socket.gethostname():
        return False
    try:
        return not _pid_alive(int(holder.get("pid", -1)))
    except (TypeError, ValueError):
        return False


@dataclass
class RunLock:
    """The held lock of one run folder; :meth:`release` removes it (idempotent)."""

    path: Path
    folder: Path
    """The folder the run writes into: the requested one, or its ``run-<id>`` sub-folder (append)."""

    def release(self) -> None:
        """Remove the lock file if it still is this process's."""
        holder = read_holder(self.path)
        if holder is not None and holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_create(path: Path) -> bool:
    """Create ``path`` holding this process's JSON, atomically; False if it already exists.

    Raises:
        ConfigError: the folder cannot be written (read-only, missing, not a folder).
    """
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    except OSError as e:  # a read-only or full file system, a folder that is a file, ...
        raise ConfigError(f"trainer.default_local_dir={path.parent}: cannot write its run lock {path.name} "
                          f"({e.strerror or e}); give the run a writable folder") from None
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}, f)
    return True


def _take_over(path: Path, seen: dict[str, Any]) -> bool:
    """Replace the dead lock ``seen`` with this process's, holding an exclusive ``flock`` on the folder so that
    two starters never both replace it (one would delete the other's fresh lock); False when the lock changed
    meanwhile (look again)."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if read_holder(path) != seen:
            return False
        log.warning("%s was left by %s, which is no longer running; taking it over", path, _describe(seen))
        path.unlink(missing_ok=True)
        return _try_create(path)
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a process whose lock file is unreadable"
    return f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')}"


def acquire(folder: str | Path, on_existing_run: str = "error") -> RunLock:
    """Take the run lock of ``folder`` (created if missing).

    Args:
        folder: ``trainer.default_local_dir``.
        on_existing_run: ``error`` | ``append`` (``trainer.on_existing_run``).

    Returns:
        The held lock; its ``folder`` is where the run writes (a new ``run-<id>`` sub-folder
        when another run holds ``folder`` and ``on_existing_run=append``).

    Raises:
        ConfigError: another live run holds the lock (``error``), or ``on_existing_run`` is
            not one of :data:`ON_EXISTING_RUN`.
    """
    if on_existing_run not in ON_EXISTING_RUN:
        raise ConfigError(f"trainer.on_existing_run={on_existing_run!r}: expected one of {', '.join(ON_EXISTING_RUN)}")
    folder = Path(folder)
    path = folder / LOCK_FILE
    for _ in range(3):  # a stale lock removed by another starter between our checks: try again
        if _try_create(path):
            return RunLock(path, folder)
        holder = read_holder(path)
        if holder is None:
            continue  # released meanwhile
        if _stale(holder):
            if _take_over(path, holder):
                return RunLock(path, folder)
            continue
        if on_existing_run == "append":
            sub = folder / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
            sub.mkdir(parents=True, exist_ok=True)
            log.warning("%s is in use by %s; this run writes into %s (trainer.on_existing_run=append)",
                        folder, _describe(holder), sub)
            return acquire(sub, "error")
        raise ConfigError(
            f"trainer.default_local_dir={folder} is in use by another rlforge run ({_describe(holder)}; lock file "
            f"{path}). Give this run its own folder (trainer.default_local_dir=... or trainer.experiment_name=...), "
            "wait for the other run to finish, or set trainer.on_existing_run=append to write into a new sub-folder; "
            "if no such run exists, delete the lock file"
        )
    raise ConfigError(f"could not take the run lock {path}: it keeps changing; is another run starting in {folder}?")

"""What every sandbox backend shares: limits, results, the rlimit prelude, the process runner, the registry.

The backends (:mod:`.sandbox_local`, :mod:`.sandbox_remote`, :mod:`.sandbox_unsafe`) import this module;
:mod:`.sandbox` imports them and chooses one (:func:`rlforge.tools.sandbox.select_sandbox`).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rlforge.registry import Registry

INSTALL_HINT = "apt-get install bubblewrap"
RISK_KEY = "allow_unsandboxed"


class SandboxUnavailable(ValueError):
    """No sandbox can run here (the message names what to install and the key that accepts the risk)."""


@dataclass(frozen=True)
class Limits:
    """Per-run limits: ``cpu_s`` CPU seconds per process; ``wall_s`` wall seconds for the whole tree;
    ``memory_mb`` address space per process (MiB); ``max_output_bytes`` stdout+stderr returned;
    ``max_processes`` processes/threads at once; ``file_bytes`` largest file (output included);
    ``tmpfs_mb`` size of the private ``/tmp`` (MiB)."""

    cpu_s: int = 5
    wall_s: float = 10.0
    memory_mb: int = 512
    max_output_bytes: int = 8192
    max_processes: int = 50
    file_bytes: int = 1 << 20
    tmpfs_mb: int = 64


@dataclass(frozen=True)
class RunResult:
    """One run: ``output`` (truncated text), ``exit_code`` (None when killed), ``killed`` (why, or ''),
    ``truncated`` (output was cut), ``wall_s``."""

    output: str
    exit_code: int | None
    killed: str
    truncated: bool
    wall_s: float


class Sandbox(Protocol):
    """Runs one Python program; ``name`` is its registry name."""

    name: str

    def run(self, code: str, limits: Limits) -> RunResult:
        """Run ``code`` under ``limits``; blocking (call it from a thread)."""
        ...


SANDBOXES: Registry[Callable[[dict[str, Any]], Sandbox]] = Registry(
    "sandbox", "tools[].config.sandbox (python_executor)")
"""Sandbox factories by name; each takes the tool's ``config`` and returns a sandbox or raises
:class:`SandboxUnavailable` saying why it cannot run here."""

PRELUDE = r'''
import os, resource, sys
_src = sys.stdin.read()
sys.stdin = open(os.devnull)
os.dup2(sys.stdin.fileno(), 0)
for _k, _v in {LIMITS}:
    resource.setrlimit(_k, (_v, _v))
{DROP}{GUARD}
exec(compile(_src, "main.py", "exec"), {"__name__": "__main__", "__file__": "main.py"})
'''


_DROP = r'''for _d in ("/tmp", "/dev/shm"):
    os.chown(_d, {UID}, {UID})
os.setgroups([])
os.setresgid({UID}, {UID}, {UID})
os.setresuid({UID}, {UID}, {UID})
if os.getuid() != {UID} or os.geteuid() != {UID}:
    sys.exit("sandbox: could not drop privileges")
'''


def prelude(limits: Limits, nproc: bool = True, guard: str = "", uid: int | None = None) -> str:
    """The ``python -c`` program that reads the user's code from stdin, sets the rlimits on itself (soft =
    hard, so the code cannot raise them) and runs the code; ``guard`` is inserted before the code runs.
    ``uid``: switch to this uid and gid (all three of each, no groups, so every capability is lost) after
    giving it ``/tmp`` and ``/dev/shm``; for a sandbox started by root."""
    import resource

    pairs = [(resource.RLIMIT_CPU, limits.cpu_s), (resource.RLIMIT_AS, limits.memory_mb << 20),
             (resource.RLIMIT_FSIZE, limits.file_bytes), (resource.RLIMIT_CORE, 0)]
    if nproc:
        pairs.append((resource.RLIMIT_NPROC, limits.max_processes))
    drop = "" if uid is None else _DROP.replace("{UID}", str(int(uid)))
    return (PRELUDE.replace("{LIMITS}", repr([(int(k), int(v)) for k, v in pairs])).replace("{DROP}", drop)
            .replace("{GUARD}", guard))


def _why_killed(code: int, limits: Limits) -> str:
    """The reason for a death by signal (``code``: a negative returncode, or bwrap's 128 + signal)."""
    sig = -code if code < 0 else code - 128
    return {signal.SIGXCPU: f"CPU time limit of {limits.cpu_s} s", signal.SIGKILL: "SIGKILL (CPU or memory limit)",
            signal.SIGXFSZ: f"output/file size limit of {limits.file_bytes} bytes"}.get(sig, f"signal {sig}")


def run_argv(argv: list[str], code: str, limits: Limits, *, cwd: str | None = None,
             signal_codes: bool = False) -> RunResult:
    """Run ``argv`` (a program that reads ``code`` on stdin) in its own session, stdout+stderr to a host
    file, killing its process group at ``limits.wall_s``.  ``cwd`` None: a fresh host temporary directory.
    ``signal_codes``: exit codes 129..159 mean death by signal (bwrap's and nsjail's convention).

    Raises:
        OSError: the program cannot start.
    """
    with tempfile.TemporaryDirectory(prefix="rlforge-sandbox-") as host:
        src, out_path = os.path.join(host, ".main.py"), os.path.join(host, ".output")
        with open(src, "wb") as f:  # the sandbox reads UTF-8 (LANG=C.UTF-8), whatever the host's locale
            f.write(code.encode("utf-8", errors="replace"))  # a lone surrogate becomes "?"
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": cwd or host, "TMPDIR": cwd or host}
        t0, killed = time.perf_counter(), ""
        with open(src, "rb") as stdin, open(out_path, "wb") as out:
            proc = subprocess.Popen(argv, cwd=cwd or host, env=env, stdin=stdin, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                proc.wait(timeout=limits.wall_s)
            except subprocess.TimeoutExpired:  # the group (a sandbox's PID namespace dies with it)
                killed = f"wall time limit of {limits.wall_s:g} s"
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.perf_counter() - t0
        with open(out_path, "rb") as f:
            data = f.read(limits.max_output_bytes + 1)
    rc = proc.returncode
    if not killed and (rc < 0 or (signal_codes and 128 < rc < 160)):
        killed = _why_killed(rc, limits)
    text = data[:limits.max_output_bytes].decode("utf-8", errors="replace")
    return RunResult(text, None if killed else rc, killed, len(data) > limits.max_output_bytes, wall)


def python_mounts() -> list[str]:
    """Host directories the interpreter needs beyond ``/usr``: its prefixes (a venv and its base), real paths."""
    dirs = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(
        os.path.realpath(sys.executable))))}
    return sorted(d for d in dirs if not (d == "/usr" or d.startswith("/usr/")))


def which(name: str) -> str | None:
    """``shutil.which`` (a seam for tests that simulate a machine without the program)."""
    return shutil.which(name)

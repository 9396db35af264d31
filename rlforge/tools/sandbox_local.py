"""The local sandboxes: ``bwrap`` (bubblewrap) and ``nsjail`` (see :mod:`.sandbox` for what they guarantee).

Each factory finds its program (:func:`~rlforge.tools.sandbox_base.which`), builds the command line and runs
``python -c pass`` in it once; a missing program or a failed probe is :class:`SandboxUnavailable` with the
reason (for instance: user namespaces are not allowed on this machine).
"""

from __future__ import annotations

import math
import os
import random
import sys
from typing import Any

from rlforge.tools.sandbox_base import (
    SANDBOXES,
    Limits,
    RunResult,
    Sandbox,
    SandboxUnavailable,
    prelude,
    python_mounts,
    run_argv,
    which,
)

SANDBOX_UID = 65534  # "nobody": no file of the host belongs to it
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1"}
_RUN_UIDS = random.SystemRandom()  # stateless: a fresh uid for each root-started run
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")


def _system_mounts() -> tuple[list[str], list[tuple[str, str]]]:
    """``(read-only dirs, (link, target) symlinks)`` of the system: /usr, the /lib*, /bin and /sbin dirs
    (symlinks into /usr on merged-/usr systems), the few /etc files the loader reads, and the interpreter's
    prefixes."""
    dirs, links = ["/usr"], []
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            links.append((d, os.readlink(d)))
        elif os.path.isdir(d):
            dirs.append(d)
    dirs += [e for e in _ETC if os.path.exists(e)] + python_mounts()
    return dirs, links


def _parents(paths: list[str]) -> list[str]:
    """The ancestors of ``paths`` (not ``/``), each once, shallowest first."""
    out: set[str] = set()
    for p in paths:
        p = os.path.dirname(p)
        while p not in ("/", ""):
            out.add(p)
            p = os.path.dirname(p)
    return sorted(out, key=lambda q: (q.count("/"), q))


_TMPFS = ("/tmp", "/dev/shm")  # private tmpfs mounts of every run


def _under(path: str, roots: tuple[str, ...]) -> bool:
    return any(path == r or path.startswith(r + "/") for r in roots)


def _binds(dirs: list[str], skip: tuple[str, ...] = ()) -> list[str]:
    """bwrap flags binding ``dirs`` read-only, after creating their parents (not ``skip``) mode 0755 (bwrap
    would make them 0700, unreadable by the sandbox's uid)."""
    a: list[str] = []
    for parent in _parents(dirs):
        if parent not in skip:
            a += ["--perms", "0755", "--dir", parent]
    for d in dirs:
        a += ["--ro-bind", d, d]
    return a


class BwrapSandbox:
    """Bubblewrap with new PID, network, IPC, UTS, mount (and cgroup) namespaces.

    Started by root, the sandbox drops to a fresh uid for each run (no capabilities, and ``RLIMIT_NPROC``
    counts only that run's processes: the kernel never applies it to uid 0, even inside a user namespace).
    Started by another user, it runs as uid 65534 in a user namespace with every capability dropped.
    ``extra``: flags added in the user-namespace mode (``--disable-userns`` where bwrap knows it).
    """

    name = "bwrap"

    def __init__(self, exe: str, extra: tuple[str, ...] = ("--disable-userns",), as_root: bool | None = None) -> None:
        self.exe, self.extra = exe, list(extra)
        self.as_root = os.geteuid() == 0 if as_root is None else as_root

    def argv(self, limits: Limits, uid: int | None = None) -> list[str]:
        """The command line running :func:`~rlforge.tools.sandbox.prelude` under ``limits`` (as root:
        switching to ``uid``, a fresh one when None)."""
        dirs, links = _system_mounts()
        if self.as_root:
            uid = uid or _RUN_UIDS.randrange(1 << 20, 1 << 30)
            a = [self.exe, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
        else:
            a = [self.exe, "--unshare-all", "--unshare-user", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID),
                 *self.extra, "--cap-drop", "ALL"]
        a += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
        for k, v in _ENV.items():
            a += ["--setenv", k, v]
        # a dir under the private /tmp or /dev/shm (a venv in a temporary folder) is bound after the tmpfs,
        # which would otherwise hide it
        late = [d for d in dirs if _under(d, _TMPFS)]
        a += _binds([d for d in dirs if d not in late])
        for link, target in links:
            a += ["--symlink", target, link]
        size = str(limits.tmpfs_mb << 20)
        a += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/dev/shm", "--size", size,
              "--tmpfs", "/tmp"]
        a += _binds(late, skip=_TMPFS) + ["--chdir", "/tmp", "--remount-ro", "/"]
        return a + [sys.executable, "-I", "-c", prelude(limits, uid=uid if self.as_root else None)]

    def run(self, code: str, limits: Limits) -> RunResult:
        return run_argv(self.argv(limits), code, limits, signal_codes=True)


class NsjailSandbox:
    """nsjail (``--mode o``): its default namespaces (user, PID, net, IPC, UTS, mount, cgroup), uid 65534,
    a tmpfs root with the system dirs bound read-only, and its own rlimits and time limit as a second fence."""

    name = "nsjail"

    def __init__(self, exe: str) -> None:
        self.exe = exe

    def argv(self, limits: Limits) -> list[str]:
        """The command line running :func:`~rlforge.tools.sandbox.prelude` under ``limits``."""
        dirs, links = _system_mounts()
        a = [self.exe, "--mode", "o", "--really_quiet", "--user", str(SANDBOX_UID), "--group", str(SANDBOX_UID),
             "--hostname", "sandbox", "--cwd", "/tmp", "--time_limit", str(math.ceil(limits.wall_s) + 1),
             "--rlimit_as", str(limits.memory_mb), "--rlimit_cpu", str(limits.cpu_s),
             "--rlimit_fsize", str(max(1, limits.file_bytes >> 20)), "--rlimit_nproc", str(limits.max_processes)]
        for k, v in _ENV.items():
            a += ["--env", f"{k}={v}"]
        for d in dirs + [link for link, _ in links]:
            a += ["--bindmount_ro", d]
        a += ["--tmpfsmount", "/tmp"]
        return a + ["--", sys.executable, "-I", "-c", prelude(limits)]

    def run(self, code: str, limits: Limits) -> RunResult:
        return run_argv(self.argv(limits), code, limits, signal_codes=True)


_PROBE = Limits(cpu_s=10, wall_s=20, memory_mb=1024)


def _probe(sb: Sandbox) -> str:
    """'' when ``sb`` runs a program that prints ``ok``, else what went wrong."""
    try:
        r = sb.run("print('ok')", _PROBE)
    except OSError as e:
        return str(e)
    return "" if (r.exit_code, r.output) == (0, "ok\n") else (r.output.strip() or r.killed or f"exit {r.exit_code}")


@SANDBOXES.register("bwrap")
def make_bwrap(config: dict[str, Any]) -> BwrapSandbox:
    """A :class:`BwrapSandbox` that ran a probe program here (without ``--disable-userns`` on an older bwrap).

    Raises:
        SandboxUnavailable: ``bwrap`` is not on PATH, or it cannot start a sandbox (its error is given).
    """
    exe = which("bwrap")
    if exe is None:
        raise SandboxUnavailable("`bwrap` is not installed")
    err = ""
    for extra in (("--disable-userns",), ()):
        sb = BwrapSandbox(exe, extra)
        err = _probe(sb)
        if not err or sb.as_root:
            break
    if not err:
        return sb
    raise SandboxUnavailable(f"`bwrap` is installed but its probe run failed (are new namespaces allowed here?): "
                             f"{err[-300:]}")


@SANDBOXES.register("nsjail")
def make_nsjail(config: dict[str, Any]) -> NsjailSandbox:
    """A :class:`NsjailSandbox` that ran a probe program here.

    Raises:
        SandboxUnavailable: ``nsjail`` is not on PATH, or it cannot start a jail (its error is given).
    """
    exe = which("nsjail")
    if exe is None:
        raise SandboxUnavailable("`nsjail` is not installed")
    sb = NsjailSandbox(exe)
    err = _probe(sb)
    if err:
        raise SandboxUnavailable(f"`nsjail` cannot start a jail here: {err[-300:]}")
    return sb

"""``allow_unsandboxed: true``: a limited subprocess, NOT a sandbox (used only where the user accepted the risk).

``python -I`` in a fresh host temporary directory, in its own process group, with a minimal environment, the
rlimits of :class:`~rlforge.tools.sandbox.Limits` except the process count (it would count every process
of the trainer's user), a new network namespace where ``unshare --net --map-root-user`` works, and an audit
hook refusing the common ways to open sockets and start programs.  The audit hook is advisory: code can
pass it (``_posixsubprocess.fork_exec``, a C extension), read and write the trainer's files, see and signal
its processes, and leave a child behind after the wall limit (``setsid``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys

from rlforge.tools.sandbox_base import Limits, RunResult, prelude, run_argv

AUDIT_GUARD = r'''
def _rlforge_guard(event, args):
    if event.startswith(("socket.", "subprocess.", "os.exec", "os.posix_spawn", "os.fork", "os.system",
                         "ctypes.dlopen", "ctypes.cdata", "os.forkpty", "pty.")):
        raise PermissionError(f"sandbox: {event} is not allowed")
sys.addaudithook(_rlforge_guard)
del _rlforge_guard
'''


def unshare_works() -> bool:
    """Whether ``unshare --net --map-root-user`` runs here."""
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        return subprocess.run([exe, "--net", "--map-root-user", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


class UnsandboxedSubprocess:
    """The module docstring's subprocess; ``netns`` None: use the network namespace where it works."""

    name = "unsandboxed"

    def __init__(self, netns: bool | None = None, audit_hook: bool = True) -> None:
        self.netns = unshare_works() if netns is None else netns
        self.audit_hook = audit_hook

    def run(self, code: str, limits: Limits) -> RunResult:
        argv = [sys.executable, "-I", "-c", prelude(limits, nproc=False, guard=AUDIT_GUARD if self.audit_hook else "")]
        if self.netns:
            argv = [shutil.which("unshare") or "unshare", "--net", "--map-root-user", *argv]
        return run_argv(argv, code, limits)

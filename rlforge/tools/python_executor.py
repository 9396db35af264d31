"""``python_executor``: run the model's Python code in a limited subprocess.

Each call starts ``python -I`` (isolated: no user site-packages, no ``PYTHON*`` variables) in a
fresh temporary working directory (deleted afterwards), with a minimal environment, in its own
process group, and these limits (``config`` keys, defaults in brackets):

* ``cpu_s`` [5]: CPU seconds (``RLIMIT_CPU``; the kernel kills the child past it);
* ``wall_s`` [10]: wall seconds; the process group is killed past it;
* ``memory_mb`` [512]: address space (``RLIMIT_AS``), so a large allocation raises ``MemoryError``;
* ``max_output_bytes`` [8192]: stdout + stderr returned (the rest is cut, and said so); the child's
  files, its output included, are capped at 1 MiB (``RLIMIT_FSIZE``), so a 10 MB print stops early;
* no network: the child runs in a new network namespace (``unshare --net --map-root-user``) when the
  machine allows unprivileged user namespaces; in every case an audit hook installed before the
  user's code refuses ``socket`` creation/connection, ``ctypes`` loading and starting processes
  (``subprocess``, ``os.system``, ``os.exec*``, ``os.posix_spawn``, ``os.fork``).  Without the
  namespace, code that reaches the network without those calls (a C extension) is not stopped:
  :attr:`PythonExecutorTool.network_isolation` says which mode is in use.

The tool returns the program's output (stdout, then stderr), with ``exit status N`` or
``killed: ...`` appended when the program did not exit 0.  Limits are POSIX; on other systems the
tool raises at construction.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

from rlforge.tools.base import BaseTool, ToolError, ToolResponse
from rlforge.tools.registry import TOOLS

_PRELUDE = r'''
import resource, sys
for _k, _v in {LIMITS}:
    resource.setrlimit(_k, (_v, _v))
def _rlforge_guard(event, args):
    if event.startswith(("socket.", "subprocess.", "os.exec", "os.posix_spawn", "os.fork", "os.system",
                         "ctypes.dlopen", "ctypes.cdata", "os.forkpty", "pty.")):
        raise PermissionError(f"sandbox: {event} is not allowed")
sys.addaudithook(_rlforge_guard)
del _rlforge_guard
__file__ = "main.py"
exec(compile(open("main.py").read(), "main.py", "exec"), {"__name__": "__main__"})
'''


@dataclass(frozen=True)
class RunResult:
    """One run: ``output`` (truncated text), ``exit_code`` (None when killed), ``killed`` (why, or ''),
    ``truncated`` (output was cut), ``wall_s``."""

    output: str
    exit_code: int | None
    killed: str
    truncated: bool
    wall_s: float


def _limits(cpu_s: int, memory_mb: int, file_bytes: int) -> str:
    """The ``(resource, value)`` pairs the child sets on itself (soft = hard, so the user's code cannot raise
    them) before the user's code runs; set in the child rather than in a ``preexec_fn``, which is not safe
    while the parent runs threads."""
    import resource

    pairs = [(resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory_mb << 20),
             (resource.RLIMIT_FSIZE, file_bytes), (resource.RLIMIT_CORE, 0)]
    return repr([(int(k), int(v)) for k, v in pairs])


def _unshare_works() -> bool:
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        return subprocess.run([exe, "--net", "--map-root-user", "true"], capture_output=True, timeout=5).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def run_python(code: str, *, cpu_s: int = 5, wall_s: float = 10.0, memory_mb: int = 512, max_output_bytes: int = 8192,
               netns: bool = True, audit_hook: bool = True) -> RunResult:
    """Run ``code`` under the limits of the module docstring (``netns``: use the network namespace;
    ``audit_hook=False`` leaves the audit hook out, for testing the namespace alone).

    Blocking; call it from a thread.  Raises OSError only when the interpreter cannot start.
    """
    import time

    with tempfile.TemporaryDirectory(prefix="rlforge-sandbox-") as work:
        with open(os.path.join(work, "main.py"), "w") as f:
            f.write(code)
        out_path = os.path.join(work, ".output")
        prelude = _PRELUDE if audit_hook else _PRELUDE[:_PRELUDE.index("def _rlforge_guard")] + _PRELUDE[
            _PRELUDE.index("__file__"):]
        prelude = prelude.replace("{LIMITS}", _limits(cpu_s, memory_mb, 1 << 20))
        cmd = [sys.executable, "-I", "-c", prelude]
        if netns:
            cmd = [shutil.which("unshare") or "unshare", "--net", "--map-root-user", *cmd]
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"}
        t0 = time.perf_counter()
        killed = ""
        with open(out_path, "wb") as out:
            proc = subprocess.Popen(cmd, cwd=work, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                proc.wait(timeout=wall_s)
            except subprocess.TimeoutExpired:
                killed = f"wall time limit of {wall_s:g} s"
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        wall = time.perf_counter() - t0
        with open(out_path, "rb") as f:
            data = f.read(max_output_bytes + 1)
    code_ = proc.returncode
    if not killed and code_ is not None and code_ < 0:
        sig = -code_
        killed = {signal.SIGXCPU: f"CPU time limit of {cpu_s} s", signal.SIGKILL: "SIGKILL (CPU or memory limit)",
                  signal.SIGXFSZ: "output/file size limit of 1 MiB"}.get(sig, f"signal {sig}")
    truncated = len(data) > max_output_bytes
    text = data[:max_output_bytes].decode("utf-8", errors="replace")
    return RunResult(text, None if killed else code_, killed, truncated, wall)


@TOOLS.register("python_executor", "rlforge.tools.python_executor.PythonExecutorTool")
class PythonExecutorTool(BaseTool):
    """Sandboxed Python; the model's argument is ``code`` (a string).  ``config``: see the module docstring,
    plus ``network_namespace`` (``auto`` [default] | ``true`` | ``false``).

    Raises:
        ValueError: a non-positive limit, or ``network_namespace: true`` where namespaces are not allowed.
    """

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        if os.name != "posix":
            raise ValueError("python_executor needs a POSIX system (resource limits)")
        self.cpu_s = int(self.config.get("cpu_s", 5))
        self.wall_s = float(self.config.get("wall_s", 10.0))
        self.memory_mb = int(self.config.get("memory_mb", 512))
        self.max_output_bytes = int(self.config.get("max_output_bytes", 8192))
        for k in ("cpu_s", "wall_s", "memory_mb", "max_output_bytes"):
            if getattr(self, k) <= 0:
                raise ValueError(f"{k} must be > 0, got {getattr(self, k)}")
        want = self.config.get("network_namespace", "auto")
        ok = _unshare_works() if want in ("auto", True) else False
        if want is True and not ok:
            raise ValueError("network_namespace: true, but `unshare --net --map-root-user` does not work here")
        self.network_isolation = "namespace+audit_hook" if ok else "audit_hook"

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str):
            raise ToolError("missing string argument 'code'")
        r = await asyncio.to_thread(run_python, code, cpu_s=self.cpu_s, wall_s=self.wall_s, memory_mb=self.memory_mb,
                                    max_output_bytes=self.max_output_bytes,
                                    netns=self.network_isolation.startswith("namespace"))
        text = r.output
        if r.truncated:
            text += f"\n...(output cut at {self.max_output_bytes} bytes)"
        if r.killed:
            text += f"\nkilled: {r.killed}"
        elif r.exit_code:
            text += f"\nexit status {r.exit_code}"
        return ToolResponse(text), 0.0, {"exit_code": r.exit_code, "killed": r.killed, "wall_s": r.wall_s}

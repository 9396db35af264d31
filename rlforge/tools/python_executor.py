"""``python_executor``: run the model's Python code in a sandbox (:mod:`.sandbox`; docs/sandbox.md).

``config`` keys (defaults in brackets):

* ``sandbox`` [auto]: ``auto`` (bwrap, else nsjail), ``bwrap``, ``nsjail`` or ``remote``;
* ``sandbox_fusion_url`` [unset]: a SandboxFusion endpoint (``http://HOST:8080/run_code``); set, it is used;
* ``allow_unsandboxed`` [false]: where no sandbox is usable, run the code in a limited subprocess anyway
  (a loud warning; NOT a sandbox).  Without it, the tool refuses to start there;
* ``cpu_s`` [5]: CPU seconds per process (the kernel kills past it);
* ``wall_s`` [10]: wall seconds; the whole process tree is killed past it;
* ``memory_mb`` [512]: address space per process, so a large allocation raises ``MemoryError``;
* ``max_processes`` [50]: processes and threads at once in the sandbox;
* ``max_output_bytes`` [8192]: stdout + stderr returned (the rest is cut, and said so); files, the output
  included, are capped at 1 MiB, so a 10 MB print stops early;
* ``type`` [native]: verl's tool config field, accepted and ignored.

The tool returns the program's output (stdout, then stderr), with ``exit status N`` or ``killed: ...``
appended when the program did not exit 0.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from rlforge.tools.base import BaseTool, ToolError, ToolResponse
from rlforge.tools.registry import TOOLS
from rlforge.tools.sandbox import RISK_KEY, Limits, Sandbox, select_sandbox

KEYS = ("type", "sandbox", "sandbox_fusion_url", RISK_KEY, "cpu_s", "wall_s", "memory_mb", "max_processes",
        "max_output_bytes")


def limits_from_config(config: dict[str, Any]) -> Limits:
    """The :class:`~rlforge.tools.sandbox.Limits` of a tool ``config``.

    Raises:
        ValueError: an unknown key (the valid ones are listed) or a limit that is not a number > 0.
    """
    unknown = sorted(set(config) - set(KEYS))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown key; python_executor's keys are {', '.join(KEYS)}")
    d = Limits()
    vals: dict[str, Any] = {}
    for k, cast in (("cpu_s", int), ("wall_s", float), ("memory_mb", int), ("max_processes", int),
                    ("max_output_bytes", int)):
        raw = config.get(k, getattr(d, k))
        try:
            if isinstance(raw, bool) or not math.isfinite(float(raw)):  # true is not 1; nan/inf is no limit
                raise ValueError
            vals[k] = cast(raw)
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f"{k}={raw!r}: must be a finite number > 0") from None
        if cast is int and float(raw) != vals[k]:  # 1.7 CPU seconds would silently become 1
            raise ValueError(f"{k}={raw!r}: must be a whole number (the kernel's limit counts whole units)")
        if vals[k] <= 0:
            raise ValueError(f"{k}={raw!r}: must be > 0")
    if not isinstance(config.get(RISK_KEY, False), bool):
        raise ValueError(f"{RISK_KEY}={config.get(RISK_KEY)!r}: must be true or false")
    return Limits(**vals)


@TOOLS.register("python_executor", "rlforge.tools.python_executor.PythonExecutorTool")
class PythonExecutorTool(BaseTool):
    """Sandboxed Python; the model's argument is ``code`` (a string).  ``config``: see the module docstring.

    Attributes:
        sandbox: the :class:`~rlforge.tools.sandbox.Sandbox` in use (``sandbox.name``).
        limits: the :class:`~rlforge.tools.sandbox.Limits` of every run.

    Raises:
        ValueError: a bad key or limit (:func:`limits_from_config`).
        SandboxUnavailable: no sandbox here and ``allow_unsandboxed`` is not true.
    """

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        self.limits = limits_from_config(self.config)
        self.sandbox: Sandbox = select_sandbox(self.config)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str):
            raise ToolError("missing string argument 'code'")
        r = await asyncio.to_thread(self.sandbox.run, code, self.limits)
        text = r.output
        if r.truncated:
            text += f"\n...(output cut at {self.limits.max_output_bytes} bytes)"
        if r.killed:
            text += f"\nkilled: {r.killed}"
        elif r.exit_code:
            text += f"\nexit status {r.exit_code}"
        return ToolResponse(text), 0.0, {"exit_code": r.exit_code, "killed": r.killed, "wall_s": r.wall_s}

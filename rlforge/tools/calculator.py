"""``calculator``: exact arithmetic on integers and decimals, evaluated from a parsed expression.

The model calls ``{"name": "calculator", "arguments": {"expression": "123456789 * 987654321"}}`` and
gets ``121932631112635269`` back.  Only numbers, ``+ - * / // % **``, unary signs and parentheses
are allowed (the expression is parsed with :mod:`ast`, never ``eval``-ed); integers stay exact
(Python integers), ``/`` gives a float unless it divides exactly.

Limits (``config`` keys): expressions of at most ``max_length`` characters [512], exponents of at most
1000, results of at most ``max_digits`` digits [4000], refused before they are computed
(:mod:`.calc_eval`), and ``timeout_s`` [2.0] seconds per call.  The evaluation runs in a worker process
(``python -I calc_eval.py``), never in the trainer: the trainer's thread waits on a pipe without the GIL,
and a call past ``timeout_s`` kills the worker (a new one starts at the next call).  A bad expression
raises :class:`~rlforge.tools.base.ToolError`, whose message is what the model reads.
"""

from __future__ import annotations

import asyncio
import json
import select
import subprocess
import sys
import threading
import time
from typing import Any

from rlforge.tools import calc_eval
from rlforge.tools.base import BaseTool, ToolError, ToolResponse
from rlforge.tools.registry import TOOLS

KEYS = ("type", "max_length", "max_digits", "timeout_s")


def evaluate(expression: str, max_digits: int = 4000) -> int | float:
    """:func:`rlforge.tools.calc_eval.evaluate` in this process (bounded, see there), errors as ToolError."""
    try:
        return calc_eval.evaluate(expression, max_digits)
    except calc_eval.CalcError as e:
        raise ToolError(str(e)) from None


class CalcWorker:
    """One ``calc_eval`` worker process, started on first use, killed past a call's timeout or on :meth:`close`.

    Calls are serialised (a lock); each waits at most ``timeout_s`` in all, for the lock and the answer.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None

    def _start(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen([sys.executable, "-I", calc_eval.__file__], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={"LANG": "C.UTF-8"})
        return self._proc

    def call(self, expr: str, max_digits: int, timeout_s: float) -> str:
        """The value of ``expr`` as text.

        Raises:
            ToolError: the expression's own error, or no answer within ``timeout_s`` (the worker is killed).
        """
        deadline = time.monotonic() + timeout_s
        if not self._lock.acquire(timeout=timeout_s):
            raise ToolError(f"the calculator is busy; no answer within {timeout_s:g} s")
        try:
            proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write((json.dumps({"expr": expr, "max_digits": max_digits}) + "\n").encode())
            proc.stdin.flush()
            ready, _, _ = select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = proc.stdout.readline() if ready else b""
            if not line:
                self._kill()
                raise ToolError(f"the calculation took longer than {timeout_s:g} s (stopped)")
            ans = json.loads(line)
        finally:
            self._lock.release()
        if "error" in ans:
            raise ToolError(ans["error"])
        return ans["ok"]

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            self._proc = None

    def close(self) -> None:
        """Stop the worker (also done when the object is collected)."""
        with self._lock:
            self._kill()

    def __del__(self) -> None:
        proc = getattr(self, "_proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()


@TOOLS.register("calculator", "rlforge.tools.calculator.CalculatorTool")
class CalculatorTool(BaseTool):
    """Arithmetic on the model's ``expression`` argument; ``config``: ``max_length``, ``max_digits``, ``timeout_s``.

    Raises:
        ValueError: an unknown ``config`` key, or a limit that is not a number > 0.
    """

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        unknown = sorted(set(self.config) - set(KEYS))
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown key; calculator's keys are {', '.join(KEYS)}")
        try:
            self.max_length = int(self.config.get("max_length", 512))
            self.max_digits = int(self.config.get("max_digits", 4000))
            self.timeout_s = float(self.config.get("timeout_s", 2.0))
        except (TypeError, ValueError):
            raise ValueError("max_length, max_digits and timeout_s must be numbers > 0") from None
        if min(self.max_length, self.max_digits, self.timeout_s) <= 0:
            raise ValueError("max_length, max_digits and timeout_s must be > 0")
        self.worker = CalcWorker()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        expr = parameters.get("expression")
        if not isinstance(expr, str):
            raise ToolError("missing string argument 'expression'")
        if len(expr) > self.max_length:
            raise ToolError(f"expression longer than {self.max_length} characters")
        value = await asyncio.to_thread(self.worker.call, expr, self.max_digits, self.timeout_s)
        return ToolResponse(value), 0.0, {}

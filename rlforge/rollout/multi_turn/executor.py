"""Running one model turn's tool calls: concurrently, each under a time and an output limit.

Every call runs in its own daemon thread with its own event loop (the tools are ``async``, in verl's
shape, but a user's tool may block), and the caller waits at most ``timeout_s`` for it.  A call that
does not finish in time is reported as ``timeout`` and abandoned: its thread keeps running in the
background until the tool returns (the shipped ``python_executor`` kills its subprocess at its own
wall limit).  Every outcome is a :class:`CallResult` with a status, never an exception:

==============  ==============================================================
``success``     the tool returned; its text is the response
``error``       the tool raised (its message is the response), or returned no text
``timeout``     the tool ran past ``timeout_s``
``parse_error`` the ``<tool_call>`` block did not parse
``unknown_tool`` the name is not a configured tool
``skipped``     beyond ``max_parallel_calls`` in one turn
==============  ==============================================================

Only calls that run use up one of the turn's ``max_parallel_calls`` slots: a block that did not parse
or names an unknown tool gets its error text back without taking a valid call's place.  Responses are
made valid text (:func:`~rlforge.rollout.multi_turn.parser.clean_text`: bytes decoded, lone surrogates
replaced) and those longer than ``max_chars`` characters are cut (``truncate``, verl's three sides).
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from rlforge.rollout.multi_turn.parser import ToolCall, ToolCallError, clean_text
from rlforge.tools.base import ToolError

STATUSES = ("success", "error", "timeout", "parse_error", "unknown_tool", "skipped")


@dataclass
class CallResult:
    """One call's outcome: ``name`` ('' when it did not parse), ``status`` (see the module table),
    ``text`` (what the model reads, already cut), ``reward`` (the tool's step reward), ``wall_s``."""

    name: str
    status: str
    text: str
    reward: float = 0.0
    wall_s: float = 0.0


def truncate(text: str, max_chars: int, side: str) -> str:
    """``text`` cut to ``max_chars`` characters plus a ``...(truncated)`` marker; ``side`` keeps the
    start (``left``), the end (``right``) or both halves (``middle``), as verl does."""
    if len(text) <= max_chars:
        return text
    if side == "left":
        return text[:max_chars] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-max_chars:]
    half = max_chars // 2
    return text[:half] + "...(truncated)..." + text[len(text) - (max_chars - half):]


class ToolExit(RuntimeError):
    """A tool (user code) raised ``SystemExit``, ``KeyboardInterrupt`` or ``GeneratorExit``: the call's error,
    never the end of the trainer (a ``sys.exit(0)`` in a tool would otherwise end the run with status 0)."""


def _in_thread(coro_fn: Any) -> Future:
    fut: Future = Future()

    def run() -> None:
        try:
            fut.set_result(asyncio.run(coro_fn()))
        except (SystemExit, KeyboardInterrupt, GeneratorExit) as e:
            fut.set_exception(ToolExit(f"the tool raised {type(e).__name__}({e})"))
        except BaseException as e:  # noqa: BLE001 - every failure becomes the call's status
            fut.set_exception(e)

    threading.Thread(target=run, daemon=True, name="rlforge-tool").start()
    return fut


@dataclass
class SampleTools:
    """The tool instances of one sample (created on first use, with the sample's ``tools_kwargs``)."""

    tools: dict[str, Any]
    tools_kwargs: dict[str, Any] = field(default_factory=dict)
    instances: dict[str, str] = field(default_factory=dict)
    step_reward: float = 0.0
    reward_scores: dict[str, Any] = field(default_factory=dict)

    def _kw(self, name: str, which: str) -> dict[str, Any]:
        return dict((self.tools_kwargs.get(name) or {}).get(which) or {})

    async def _call(self, call: ToolCall) -> tuple[str, float]:
        tool = self.tools[call.name]
        if call.name not in self.instances:
            created = await tool.create(None, **self._kw(call.name, "create_kwargs"))
            self.instances[call.name] = created[0] if isinstance(created, tuple) else created
        out = await tool.execute(self.instances[call.name], call.arguments, **self._kw(call.name, "execute_kwargs"))
        resp, reward = (out[0], out[1]) if isinstance(out, tuple) else (out, 0.0)
        text = resp if isinstance(resp, str | bytes) else getattr(resp, "text", None)
        if text is None:
            raise ToolError("the tool returned no text")
        return clean_text(text if isinstance(text, bytes) else str(text)), float(reward or 0.0)

    def start(self, calls: list[ToolCall | ToolCallError], max_parallel: int) -> list[Future | CallResult]:
        """Start every call of one turn; a :class:`CallResult` where the outcome is known at once.  The first
        ``max_parallel`` calls of configured tools run; calls that do not parse or name an unknown tool
        take no slot."""
        out: list[Future | CallResult] = []
        running = 0
        for c in calls:
            if isinstance(c, ToolCallError):
                out.append(CallResult("", "parse_error", c.message))
            elif c.name not in self.tools:
                out.append(CallResult(c.name, "unknown_tool", f"error: unknown tool {c.name!r}; available: "
                                                              f"{', '.join(sorted(self.tools)) or 'none'}"))
            elif running >= max_parallel:
                out.append(CallResult(c.name, "skipped", f"error: at most {max_parallel} tool calls per turn; "
                                                         f"{c.name!r} was not run"))
            else:
                running += 1
                out.append(_in_thread(lambda c=c: self._call(c)))
        return out

    def finish(self, started: list[Future | CallResult], calls: list[Any], timeout_s: float, max_chars: int,
               side: str, t0: float) -> list[CallResult]:
        """Wait for the started calls (all within ``timeout_s`` of ``t0``, a ``time.monotonic()``)."""
        import time

        results = []
        for s, c in zip(started, calls, strict=True):
            if isinstance(s, CallResult):  # its text may echo the model's own (an unknown tool's name): cut too
                s.text = truncate(s.text, max_chars, side)
                results.append(s)
                continue
            try:
                text, reward = s.result(timeout=max(0.0, t0 + timeout_s - time.monotonic()))
                r = CallResult(c.name, "success", text, reward)
            except TimeoutError:
                r = CallResult(c.name, "timeout", f"error: the tool {c.name!r} took longer than {timeout_s:g} s")
            except Exception as e:  # noqa: BLE001 - the tool's own error, shown to the model
                r = CallResult(c.name, "error", f"error: {type(e).__name__}: {e}")
            r.text = truncate(clean_text(r.text), max_chars, side)
            r.wall_s = time.monotonic() - t0
            self.step_reward += r.reward
            results.append(r)
        return results

    def close(self, timeout_s: float) -> float:
        """``calc_reward`` then ``release`` every created instance; returns the summed numeric rewards
        (a tool that raises or hangs there adds 0).  Every ``calc_reward`` value, as returned (verl's
        ``SearchTool`` returns a list of texts), is kept in :attr:`reward_scores` ``{tool name: value}``;
        a tool that raises or hangs has no entry."""
        total = 0.0
        for name, iid in self.instances.items():
            tool = self.tools[name]
            try:
                value = _in_thread(lambda t=tool, i=iid, n=name: t.calc_reward(i, **self._kw(n, "calc_reward_kwargs"))
                                   ).result(timeout=timeout_s)
                self.reward_scores[name] = value
                if isinstance(value, int | float) and not isinstance(value, bool):
                    total += float(value)
            except Exception:  # noqa: BLE001
                pass
            try:
                _in_thread(lambda t=tool, i=iid, n=name: t.release(i, **self._kw(n, "release_kwargs"))).result(timeout=timeout_s)
            except Exception:  # noqa: BLE001
                pass
        return total

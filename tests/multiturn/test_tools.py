"""The shipped tools and the Hermes parser: the calculator against Python's own integers, its size bounds and
its killable worker (the python_executor's sandbox is tested in test_sandbox.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rlforge.rollout.multi_turn.executor import SampleTools, truncate
from rlforge.rollout.multi_turn.parser import ToolCall, ToolCallError, parse_hermes
from rlforge.tools import ToolError
from rlforge.tools.calculator import evaluate


def test_calculator_exact_and_refuses_code():
    assert evaluate("123456789123456789 * 987654321987654321") == 123456789123456789 * 987654321987654321
    assert evaluate("(7 - 10) * 2 ** 10 // 3") == (7 - 10) * 2**10 // 3
    assert evaluate("10 / 4") == 2.5 and evaluate("10 / 5") == 2
    for bad in ("__import__('os')", "2 ** 100000", "1/0", "x + 1", "1 +"):
        with pytest.raises(ToolError):
            evaluate(bad)


def test_hermes_parser():
    text = ('a <tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call> b '
            '<tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call>'
            '<tool_call>{"name": "h", "arguments": [1]}</tool_call><tool_call>[1]</tool_call>'
            '<tool_call>{"name": </tool_call><tool_call>{"name": "open"}')
    got = parse_hermes(text)
    assert got[:2] == [ToolCall("f", {"x": 1}), ToolCall("g", {"y": 2})]
    assert all(isinstance(g, ToolCallError) for g in got[2:]) and len(got) == 6
    assert "not closed" in got[-1].message and "not valid JSON" in got[-2].message
    assert parse_hermes("no calls here") == []


def test_truncate_sides():
    s = "abcdefghij"
    assert truncate(s, 4, "left") == "abcd...(truncated)"
    assert truncate(s, 4, "right") == "(truncated)...ghij"
    assert truncate(s, 4, "middle") == "ab...(truncated)...ij"
    assert truncate(s, 20, "middle") == s


HOSTILE = "(7**1000*7**1000*7**1000*7**1000)**1000"  # ~7 s of GIL-holding work in the old in-thread calculator


def _calc(config=None):
    from rlforge.tools import parse_tool_schema
    from rlforge.tools.calculator import CalculatorTool

    return CalculatorTool(config or {}, parse_tool_schema({"type": "function", "function": {
        "name": "calculator", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}))


@pytest.mark.e2e
def test_calculator_tool_answers_in_its_worker():
    tool = _calc()
    try:
        for expr, want in (("123456789123456789 * 987654321987654321", 123456789123456789 * 987654321987654321),
                           ("(7 - 10) * 2 ** 10 // 3", (7 - 10) * 2**10 // 3), ("10 / 4", 2.5), ("-2 ** 3 % 5", -2**3 % 5),
                           ("7 ** 1000 % 1000007", 7**1000 % 1000007)):
            assert asyncio.run(tool.execute("i", {"expression": expr}))[0].text == str(want)
        pid = tool.worker._proc.pid
        with pytest.raises(ToolError, match="only numbers"):
            asyncio.run(tool.execute("i", {"expression": "__import__('os')"}))
        assert tool.worker._proc.pid == pid  # one worker serves every call
    finally:
        tool.worker.close()


def test_calculator_refuses_huge_results_before_computing():
    for expr in (HOSTILE, "99 ** 1000 * 99 ** 1000 * 99 ** 1000", "(10 ** 1000) * (10 ** 1000) * (10 ** 1000) * (10 ** 1000) * (10 ** 1000)"):
        t0 = time.monotonic()
        with pytest.raises(ToolError, match="more than 4000 digits"):
            evaluate(expr)
        assert time.monotonic() - t0 < 2.0  # refused before computing (computing HOSTILE takes ~7 s); margin for a loaded CI
    assert evaluate("10 ** 999 * 10 ** 999 * 10 ** 999 * 10 ** 999") == 10**3996  # near the bound, still fine


@pytest.mark.e2e
def test_calculator_timeout_is_kept_and_the_trainer_does_not_stall():
    tool = _calc({"max_digits": 10**9, "timeout_s": 0.5})  # a bound so large that the hostile call runs
    ticks, stop = [time.monotonic()], threading.Event()

    def tick():  # a trainer thread: it must keep running while the tool computes
        while not stop.is_set():
            time.sleep(0.01)
            ticks.append(time.monotonic())

    threading.Thread(target=tick, daemon=True).start()
    st = SampleTools({"calculator": tool})
    calls = [ToolCall("calculator", {"expression": HOSTILE})]
    t0 = time.monotonic()
    (r,) = st.finish(st.start(calls, 4), calls, 0.5, 1000, "middle", t0)
    took = time.monotonic() - t0
    time.sleep(0.7)  # the tool's own thread ends too: its worker is killed at timeout_s
    stop.set()
    try:
        assert r.status == "timeout" and took < 1.5, (r, took)
        assert max(b - a for a, b in zip(ticks, ticks[1:], strict=False)) < 0.25
        assert tool.worker._proc is None  # killed
        assert asyncio.run(tool.execute("i", {"expression": "6*7"}))[0].text == "42"  # a fresh worker
    finally:
        tool.worker.close()


@pytest.mark.parametrize("expr", ["1e999", "1e308 * 10", "1e308 * 10 - 1e308 * 10", "-1e308 - 1e308", "1e200 * 1e200 / 1e300"])
def test_calculator_float_overflow_is_an_error_not_inf_or_nan(expr):
    # float * and + give inf (then nan), not OverflowError: the model must never read "inf" or "nan" as an answer
    with pytest.raises(ToolError, match="too large"):
        evaluate(expr)
    assert evaluate("1e308 * 1.5 / 10") == 1e308 * 1.5 / 10 and evaluate("1e-400") == 0.0

"""The shipped tools and the Hermes parser: the calculator against Python's own integers, the sandbox's
hostile-code tests of the sandbox are in test_sandbox.py)."""

from __future__ import annotations

import pytest

from rlforge.rollout.multi_turn.executor import truncate
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

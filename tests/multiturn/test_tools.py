"""The shipped tools and the Hermes parser: the calculator against Python's own integers, the sandbox's
limits (no network, CPU time, memory, wall time, output size, temporary directory)."""

from __future__ import annotations

import socket
import threading

import pytest

from rlforge.rollout.multi_turn.executor import truncate
from rlforge.rollout.multi_turn.parser import ToolCall, ToolCallError, parse_hermes
from rlforge.tools import ToolError
from rlforge.tools.calculator import evaluate
from rlforge.tools.python_executor import PythonExecutorTool, _unshare_works, run_python


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


def test_sandbox_limits():
    assert run_python("import os; print(os.getcwd().split('/')[-1].startswith('rlforge-sandbox-'))").output == "True\n"
    r = run_python("while True: pass", cpu_s=1, wall_s=20)
    assert r.exit_code is None and "CPU" in r.killed
    r = run_python("import time; time.sleep(60)", wall_s=1)
    assert r.exit_code is None and "wall" in r.killed and r.wall_s < 5
    r = run_python("x = bytearray(1 << 30)", memory_mb=256)
    assert "MemoryError" in r.output and r.exit_code == 1
    r = run_python("print('y' * 10_000_000)", max_output_bytes=1000)
    assert r.truncated and len(r.output) == 1000 and r.wall_s < 5


def test_sandbox_no_network():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    threading.Thread(target=lambda: srv.accept(), daemon=True).start()
    code = f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=2); print('conn' + 'ected')"
    assert "connected" in run_python(code, netns=False, audit_hook=False).output  # the check can see a connection
    r = run_python(code, netns=False)  # the audit hook alone
    assert "connected" not in r.output and "sandbox: socket" in r.output
    if _unshare_works():  # the network namespace alone
        r = run_python(code, netns=True, audit_hook=False)
        assert "connected" not in r.output and ("refused" in r.output or "unreachable" in r.output.lower())
    srv.close()
    tool = PythonExecutorTool({}, _schema())
    assert tool.network_isolation in ("namespace+audit_hook", "audit_hook")


def _schema():
    from rlforge.tools import parse_tool_schema

    return parse_tool_schema({"type": "function", "function": {"name": "python", "parameters": {
        "type": "object", "properties": {"code": {"type": "string"}}}}})

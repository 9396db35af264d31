"""A checker of the Trace Event Format (JSON object form), as Perfetto and chrome://tracing
read it: shared by the trace and report tests."""

from __future__ import annotations

import math
from numbers import Real


def check_trace_schema(obj: dict) -> list[dict]:
    """Assert ``obj`` follows the Trace Event Format's JSON object form as Perfetto and
    chrome://tracing read it; return its complete (``X``) events."""
    assert isinstance(obj, dict) and isinstance(obj["traceEvents"], list)
    assert obj.get("displayTimeUnit", "ms") in ("ms", "ns")
    complete = []
    for e in obj["traceEvents"]:
        assert isinstance(e["name"], str) and e["name"]
        assert e["ph"] in ("X", "M", "C"), e
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
            assert isinstance(e["args"], dict) and ("name" in e["args"] or "sort_index" in e["args"])
            continue
        assert isinstance(e["ts"], Real) and math.isfinite(e["ts"]) and e["ts"] >= 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], Real) and e["dur"] >= 0
            complete.append(e)
        else:
            assert e["args"] and all(isinstance(v, Real) for v in e["args"].values())
    # complete events of one thread nest properly (no partial overlap), or viewers draw them wrongly
    by_thread: dict[tuple[int, int], list[dict]] = {}
    for e in complete:
        by_thread.setdefault((e["pid"], e["tid"]), []).append(e)
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[float] = []
        for e in events:
            while stack and stack[-1] <= e["ts"]:
                stack.pop()
            end = e["ts"] + e["dur"]
            assert not stack or end <= stack[-1] + 1e-3, f"{e['name']} overlaps its parent"
            stack.append(end)
    return complete

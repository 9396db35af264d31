"""Per-step metrics of a multi-turn rollout (verl's ``num_turns/*`` names, plus tool counts).

* ``num_turns/{mean,max,min}``: turns per conversation, counted as verl does (the prompt, each
  model turn, each inserted tool/user turn);
* ``multi_turn/tool_calls/{mean,max}``: tool calls per sample (parsed blocks, bad ones included);
* ``multi_turn/tool/<name>/{calls,success,error,timeout}``: counts per tool over the batch;
  ``multi_turn/parse_error``, ``multi_turn/unknown_tool``, ``multi_turn/skipped``: calls that reached no tool;
* ``multi_turn/truncated_ratio``: share of conversations cut by the response budget
  (inside a model turn or at a turn boundary); ``multi_turn/stop/<reason>``: share per stop reason;
* ``multi_turn/inserted_tokens/mean``: tool/user tokens per sample (``response_length/*`` counts
  model tokens only, through ``response_mask``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any


def multi_turn_metrics(convs: list[Any], masks: dict[int, list[int]]) -> dict[str, float]:
    """The metrics above from the finished :class:`~.conversation.Conversation` list and the per-row masks."""
    n = max(len(convs), 1)
    turns = [c.num_turns for c in convs] or [0]
    calls = [len(c.calls) for c in convs] or [0]
    m: dict[str, float] = {
        "num_turns/mean": sum(turns) / n, "num_turns/max": float(max(turns)), "num_turns/min": float(min(turns)),
        "multi_turn/tool_calls/mean": sum(calls) / n, "multi_turn/tool_calls/max": float(max(calls)),
        "multi_turn/truncated_ratio": sum(c.truncated for c in convs) / n,
        "multi_turn/inserted_tokens/mean": sum(len(v) - sum(v) for v in masks.values()) / n,
    }
    per: Counter[tuple[str, str]] = Counter()
    other: Counter[str] = Counter()
    for c in convs:
        for r in c.calls:
            if r.status in ("parse_error", "unknown_tool", "skipped"):
                other[r.status] += 1
            else:
                per[(r.name, "calls")] += 1
                per[(r.name, r.status)] += 1
    for name in sorted({k[0] for k in per}):
        for s in ("calls", "success", "error", "timeout"):
            m[f"multi_turn/tool/{name}/{s}"] = float(per[(name, s)])
    for s in ("parse_error", "unknown_tool", "skipped"):
        m[f"multi_turn/{s}"] = float(other[s])
    stops = Counter(c.stop_reason.split(":")[0] for c in convs)
    for reason, k in stops.items():
        m[f"multi_turn/stop/{reason}"] = k / n
    return m

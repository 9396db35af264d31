"""Bad tool calls in one batch: each row gets an error text as its tool response and a counted status,
the other rows are untouched, and nothing crashes.  Also: a conversation that would pass the response
budget is cut at a turn boundary and marked."""

from __future__ import annotations

import threading

import pytest
import torch
from helpers import text_prompts

from rlforge.rollout import SamplingParams
from rlforge.rollout.multi_turn.config import MultiTurnConfig
from rlforge.tools import BaseTool, ToolResponse, parse_tool_schema

pytestmark = pytest.mark.e2e

CPU = torch.device("cpu")


def _schema(name: str) -> object:
    return parse_tool_schema({"type": "function", "function": {"name": name, "parameters": {"type": "object",
                                                                                            "properties": {}}}})


class Raises(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        raise RuntimeError("boom in the tool")


class Hangs(BaseTool):
    """Blocks its thread until the test releases it: only the caller's time limit can stop the wait."""

    release = threading.Event()
    finished = threading.Event()

    async def execute(self, instance_id, parameters, **kwargs):
        self.release.wait(120)
        self.finished.set()
        return ToolResponse("late"), 0.0, {}


class Loud(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse("x" * 10_000_000), 0.0, {}


def _turn(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def _inserted_text(tok, out, row) -> str:
    r, m = out["responses"][row], out["response_mask"][row]
    n = int(out["attention_mask"][row, out["prompts"].shape[1]:].sum())
    return tok.decode([int(t) for t, k in zip(r[:n], m[:n], strict=True) if k == 0])


def test_bad_calls_are_errors_for_the_model_not_crashes(tiny_tokenizer, mt_model, calculator, scripted):
    tok = tiny_tokenizer
    tools = {"calculator": calculator, "raises": Raises({}, _schema("raises")), "hangs": Hangs({}, _schema("hangs")),
             "loud": Loud({}, _schema("loud"))}
    calls = [
        '<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"</tool_call>',  # malformed JSON
        '<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "raises", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "hangs", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "loud", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>',  # the good row
    ]
    script = {i: [_turn(tok, c), _turn(tok, "done")] for i, c in enumerate(calls)}
    mt = MultiTurnConfig(enable=True, tool_timeout_s=0.5, max_tool_response_length=100)
    ro = scripted(mt_model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, tokenizer=tok, multi_turn=mt,
                  tools=tools, script=script)
    try:
        out = ro.generate(text_prompts(tok, ["q"] * len(calls)), SamplingParams(max_new_tokens=300))
        assert not Hangs.finished.is_set()  # the hanging tool was not waited for (load-independent, no wall clock)
    finally:
        Hangs.release.set()
    texts = [_inserted_text(tok, out, i) for i in range(len(calls))]
    assert "not valid JSON" in texts[0]
    assert "unknown tool 'nope'" in texts[1] and "calculator" in texts[1]
    assert "RuntimeError: boom in the tool" in texts[2]
    assert "longer than 0.5 s" in texts[3]
    assert "(truncated)" in texts[4] and len(texts[4]) < 300
    assert "\n42<|im_end|>" in texts[5]
    # every row went on to its second model turn and ended normally
    assert list(out.non_tensor["multi_turn/stop_reason"]) == ["eos"] * len(calls)
    for i in range(len(calls)):
        n = int(out["attention_mask"][i, out["prompts"].shape[1]:].sum())
        assert out["responses"][i, n - len(script[i][1]):n].tolist() == script[i][1]
    m = ro.metrics()
    assert m["multi_turn/parse_error"] == 1 and m["multi_turn/unknown_tool"] == 1
    assert m["multi_turn/tool/raises/error"] == 1 and m["multi_turn/tool/hangs/timeout"] == 1
    assert m["multi_turn/tool/loud/success"] == 1 and m["multi_turn/tool/calculator/success"] == 1
    assert m["multi_turn/tool/calculator/calls"] == 1 and m["multi_turn/tool_calls/mean"] == 1.0


def test_conversation_past_the_budget_is_cut_at_a_turn_boundary(tiny_tokenizer, mt_model, calculator, scripted):
    tok = tiny_tokenizer
    first = _turn(tok, '<tool_call>{"name": "calculator", "arguments": {"expression": "1+1"}}</tool_call>')
    long_turn = _turn(tok, "word " * 60)
    script = {0: [first, _turn(tok, "ok")], 1: [long_turn]}
    budget = len(first) + 5  # the tool turn (11+ ids) does not fit after the first turn
    ro = scripted(mt_model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, tokenizer=tok,
                  multi_turn=MultiTurnConfig(enable=True), tools={"calculator": calculator}, script=script)
    out = ro.generate(text_prompts(tok, ["a", "b"]), SamplingParams(max_new_tokens=budget))
    assert list(out.non_tensor["multi_turn/stop_reason"]) == ["truncated_at_turn", "length"]
    w = out["prompts"].shape[1]
    assert out["responses"][0, :len(first)].tolist() == first  # ends on the model's own EOS
    assert int(out["attention_mask"][0, w:].sum()) == len(first) and int(out["response_mask"][0].sum()) == len(first)
    assert out["responses"][1].tolist() == long_turn[:budget]  # cut inside the model's turn, marked "length"
    assert ro.metrics()["multi_turn/truncated_ratio"] == 1.0

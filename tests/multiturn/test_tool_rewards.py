"""Tool rewards reach the reward function as verl passes them: each sample's ``calc_reward`` values in
``extra_info["rollout_reward_scores"]`` (``{tool name: value}``) and its turn count in
``extra_info["num_turns"]``; the built-in rules ignore them (verl's reward managers do not add them)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import torch
from helpers import text_prompts

from rlforge.rewards.manager import RewardManager
from rlforge.rollout import SamplingParams
from rlforge.rollout.multi_turn.config import MultiTurnConfig
from rlforge.tools import parse_tool_schema
from rlforge.tools.gsm8k import Gsm8kTool

CPU = torch.device("cpu")
NAME = "calc_gsm8k_reward"  # verl's function name for its gsm8k tool
SCHEMA = {"type": "function", "function": {"name": NAME, "description": "Check an answer.", "parameters": {
    "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}}}
REWARD_FN = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    rs = extra_info["rollout_reward_scores"]
    return {"score": float(rs.get("calc_gsm8k_reward", 0.0)), "num_turns": extra_info["num_turns"]}
'''


def _turn(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def _call(tok, answer):
    return _turn(tok, "<tool_call>" + json.dumps({"name": NAME, "arguments": {"answer": answer}}) + "</tool_call>")


def _reference(answers, truth):
    """The tool's own ``calc_reward`` after these calls, run directly (no agent loop)."""
    tool = Gsm8kTool({}, parse_tool_schema(SCHEMA))

    async def run():
        iid, _ = await tool.create(ground_truth=truth)
        for a in answers:
            await tool.execute(iid, {"answer": a})
        return await tool.calc_reward(iid)

    return asyncio.run(run())


def test_calc_reward_reaches_the_reward_function(tiny_tokenizer, mt_model, scripted, tmp_path):
    tok = tiny_tokenizer
    script = {0: [_call(tok, "72"), _turn(tok, "#### 72")],   # right answer through the tool
              1: [_call(tok, "70"), _call(tok, "71"), _turn(tok, "done")],  # two wrong calls
              2: [_turn(tok, "#### 72")]}                     # no tool call
    ro = scripted(mt_model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, tokenizer=tok,
                  multi_turn=MultiTurnConfig(enable=True), tools={NAME: Gsm8kTool({}, parse_tool_schema(SCHEMA))},
                  script=script)
    p = text_prompts(tok, ["Natalia sold clips..."] * 3)
    p.non_tensor["ground_truth"] = np.array(["72"] * 3, dtype=object)
    p.non_tensor["data_source"] = np.array(["openai/gsm8k"] * 3, dtype=object)
    out = ro.generate(p, SamplingParams(max_new_tokens=200))
    want = [{NAME: _reference(["72"], "72")}, {NAME: _reference(["70", "71"], "72")}, {}]
    assert want == [{NAME: 1.0}, {NAME: 0.0}, {}]
    assert list(out.non_tensor["reward_scores"]) == want
    assert list(out.non_tensor["multi_turn/num_turns"]) == [4, 6, 2]
    # step rewards (verl's -0.05 for an answer that does not improve, twice on row 1) plus calc_reward
    assert list(out.non_tensor["multi_turn/tool_reward"]) == pytest.approx([1.0, -0.1, 0.0])

    fn = tmp_path / "reward.py"
    fn.write_text(REWARD_FN)
    res = RewardManager(tok, str(fn)).score(out)
    assert res.scores.tolist() == [1.0, 0.0, 0.0] and res.extra["num_turns"] == [4.0, 6.0, 2.0]
    # the built-in GSM8K rule reads the model's tokens only and ignores the tool rewards
    assert RewardManager(tok).score(out).scores.tolist() == [1.0, 0.0, 1.0]

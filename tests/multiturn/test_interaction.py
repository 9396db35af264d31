"""verl's interaction: the built-in ``gsm8k`` one asks again after a wrong answer and ends the
conversation after a right one; ``max_user_turns`` and ``max_tokens_per_turn`` bound the conversation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from helpers import text_prompts

from rlforge.interactions import BaseInteraction
from rlforge.interactions.gsm8k import RETRY, Gsm8kInteraction
from rlforge.rollout import SamplingParams
from rlforge.rollout.multi_turn.config import MultiTurnConfig

CPU = torch.device("cpu")


def _turn(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def _user_ids(tok, content):
    return tok(f"\n<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]


def _prompts(tok, n, truths):
    p = text_prompts(tok, ["Natalia sold clips..."] * n)
    p.non_tensor["ground_truth"] = np.array(truths, dtype=object)
    return p


def test_gsm8k_interaction_retries_then_ends(tiny_tokenizer, mt_model, scripted):
    tok = tiny_tokenizer
    wrong, right = _turn(tok, "#### 71"), _turn(tok, "#### 72")
    script = {0: [wrong, right, _turn(tok, "never")], 1: [wrong, wrong, _turn(tok, "never")]}
    ro = scripted(mt_model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, tokenizer=tok,
                  multi_turn=MultiTurnConfig(enable=True, max_user_turns=1),
                  interactions={"gsm8k": Gsm8kInteraction({})}, script=script)
    out = ro.generate(_prompts(tok, 2, ["72", "72"]), SamplingParams(max_new_tokens=100))
    want = wrong + _user_ids(tok, RETRY)
    for row in (0, 1):
        n = len(want) + len(script[row][1])
        assert out["responses"][row, :n].tolist() == want + script[row][1]
        assert out["response_mask"][row, :n].tolist() == [1] * len(wrong) + [0] * (len(want) - len(wrong)) + [1] * (
            n - len(want))
        assert int(out["attention_mask"][row, out["prompts"].shape[1]:].sum()) == n
    assert list(out.non_tensor["multi_turn/stop_reason"]) == ["interaction", "max_user_turns"]
    assert list(out.non_tensor["multi_turn/interaction_score"]) == [1.0, 0.0]


class AlwaysMore(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kwargs):
        return False, "more", 0.0, {}


def test_max_tokens_per_turn_closes_the_turn_with_an_inserted_eos(tiny_tokenizer, mt_model, scripted):
    tok = tiny_tokenizer
    long = tok("one two three four five six seven eight nine ten", add_special_tokens=False)["input_ids"]
    script = {0: [long + [tok.eos_token_id]] * 3}
    ro = scripted(mt_model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, tokenizer=tok,
                  multi_turn=MultiTurnConfig(enable=True, max_tokens_per_turn=4, max_assistant_turns=3),
                  interactions={"more": AlwaysMore({})}, script=script)
    out = ro.generate(_prompts(tok, 1, ["0"]), SamplingParams(max_new_tokens=200))
    ins = [tok.eos_token_id] + _user_ids(tok, "more")
    want = long[:4] + ins + long[:4] + ins + long[:4]
    assert out["responses"][0, :len(want)].tolist() == want
    assert out["response_mask"][0, :len(want)].tolist() == ([1] * 4 + [0] * len(ins)) * 2 + [1] * 4
    assert list(out.non_tensor["multi_turn/stop_reason"]) == ["max_assistant_turns"]


def test_gsm8k_tool_reward_reaches_the_batch(tiny_tokenizer, mt_model, scripted):
    """verl's gsm8k tool config: create gets the row's ground truth, calc_reward's score and the step
    rewards land in ``multi_turn/tool_reward``, and the tool's text is the inserted response."""
    from rlforge.tools import load_tools

    path = Path(__file__).parent / "verl_gsm8k_tool_config.yaml"
    tok = tiny_tokenizer
    call = lambda a: _turn(tok, f'<tool_call>{{"name": "calc_gsm8k_reward", "arguments": {{"answer": "{a}"}}}}</tool_call>')  # noqa: E731
    script = {0: [call("72"), _turn(tok, "#### 72")], 1: [call("70"), _turn(tok, "#### 70")]}
    ro = scripted(mt_model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, tokenizer=tok,
                  multi_turn=MultiTurnConfig(enable=True), tools=load_tools(str(path)), script=script)
    out = ro.generate(_prompts(tok, 2, ["72", "72"]), SamplingParams(max_new_tokens=150))
    assert list(out.non_tensor["multi_turn/tool_reward"]) == [1.0, -0.05]
    w = out["prompts"].shape[1]
    ins = [t for t, k in zip(out["responses"][1].tolist(), out["response_mask"][1].tolist(), strict=True) if k == 0]
    assert "reward=0.0" in tok.decode(ins) and int(out["attention_mask"][1, w:].sum()) > len(ins)

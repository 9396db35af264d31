"""Token in, token out: a scripted 3-turn conversation through the native agent loop.

The training tensors must be the sampled ids plus the tool ids exactly (the tool ids written out
by hand from SmolLM2's ChatML template, not from the renderer under test), the masks and positions
must follow, and the trainer's log-probs on model tokens must equal the rollout's within 1e-4
(which only holds when the inserted turns are prefilled on top of the right cached history).
"""

from __future__ import annotations

import pytest
import torch
from helpers import text_prompts

from rlforge.roles.forward import response_log_probs
from rlforge.rollout import SamplingParams
from rlforge.rollout.multi_turn.config import MultiTurnConfig

CPU = torch.device("cpu")
PROMPTS = ["What is 123 * 456?", "Add 7 and 8 please, then tell me."]


def _turn(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]


def _tool_ids(tok, content: str) -> list[int]:
    """SmolLM2's template after the model's <|im_end|>, written out by hand."""
    return tok(f"\n<|im_start|>tool\n{content}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]


@pytest.mark.e2e
@pytest.mark.parametrize("reuse_kv", [True, False])
def test_three_turn_conversation_is_exact(tiny_tokenizer, mt_model, calculator, scripted, reuse_kv):
    tok = tiny_tokenizer
    call = lambda e: f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{e}"}}}}</tool_call>'  # noqa: E731
    script = {
        0: [_turn(tok, call("123 * 456")), _turn(tok, call("56088 + 1")), _turn(tok, "The answer is 56088.")],
        1: [_turn(tok, call("7 + 8")), _turn(tok, "It is 15"), _turn(tok, "never reached")],
    }
    ro = scripted(mt_model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, tokenizer=tok,
                         multi_turn=MultiTurnConfig(enable=True), tools={"calculator": calculator}, script=script,
                         reuse_kv=reuse_kv, max_decode_burst=4, max_num_batched_tokens=16, enable_prefix_caching=False)
    prompts = text_prompts(tok, PROMPTS)
    out = ro.generate(prompts, SamplingParams(temperature=1.0, max_new_tokens=200))

    expected = {
        0: [(script[0][0], 1), (_tool_ids(tok, "56088"), 0), (script[0][1], 1), (_tool_ids(tok, "56089"), 0),
            (script[0][2], 1)],
        1: [(script[1][0], 1), (_tool_ids(tok, "15"), 0), (script[1][1], 1)],
    }
    for row, parts in expected.items():
        ids = [t for p, _ in parts for t in p]
        mask = [m for p, m in parts for _ in p]
        n = len(ids)
        assert out["responses"][row, :n].tolist() == ids
        assert out["response_mask"][row, :n].tolist() == mask
        assert out["response_mask"][row, n:].sum() == 0 and (out["responses"][row, n:] == tok.pad_token_id).all()
        p = int(prompts["attention_mask"][row].sum())
        w = prompts["input_ids"].shape[1]
        assert out["attention_mask"][row, w - p: w + n].all() and not out["attention_mask"][row, w + n:].any()
        assert out["position_ids"][row, w: w + n].tolist() == list(range(p, p + n))
        assert out["input_ids"][row, w: w + n].tolist() == ids
    assert list(out.non_tensor["multi_turn/num_turns"]) == [6, 4]
    assert list(out.non_tensor["multi_turn/stop_reason"]) == ["eos", "eos"]
    m = ro.metrics()
    assert m["num_turns/max"] == 6 and m["num_turns/min"] == 4
    assert m["multi_turn/tool/calculator/calls"] == 3 and m["multi_turn/tool/calculator/success"] == 3

    # KV reuse: a resumed turn prefills only the turn's last model token (EOS) and the inserted ids;
    # without it, the whole history is prefilled again
    prompt_tokens = int(prompts["attention_mask"].sum())
    resumes = [(parts, i) for parts in expected.values() for i in range(1, len(parts), 2)]
    if reuse_kv:
        want = prompt_tokens + sum(1 + len(parts[i][0]) for parts, i in resumes)
    else:
        plen = [int(x) for x in prompts["attention_mask"].sum(1)]
        want = prompt_tokens + sum(plen[r] + sum(len(p) for p, _ in parts[:i + 1])
                                   for r, parts in expected.items() for i in range(1, len(parts), 2))
    assert m["rollout/prefill_tokens"] == want

    # rollout log-probs only on model tokens, and equal to the trainer's forward
    rl = out["rollout_log_probs"]
    assert (rl[out["response_mask"] == 0] == 0).all()
    trainer_lp, _ = response_log_probs(mt_model, out, 1.0, False)
    mask = out["response_mask"].bool()
    assert mask.sum() > 40
    assert (trainer_lp[mask] - rl[mask]).abs().max() < 1e-4


@pytest.mark.parametrize(("kwargs", "cap"), [({}, 16), ({"turn_burst": 5}, 5), ({"max_decode_burst": 3}, 3)])
def test_agent_loop_bursts_are_capped(tiny_tokenizer, mt_model, calculator, scripted, kwargs, cap):
    """The agent loop decodes at most ``min(max_decode_burst, turn_burst)`` steps between host reads
    (16 by default, while the single-turn engine's default is 64), and the capped bursts still give
    the scripted tokens exactly."""
    tok = tiny_tokenizer
    long_turn = _turn(tok, " ".join(["one two three four five"] * 12))  # well over 16 tokens
    script = {0: [long_turn], 1: [long_turn]}
    ro = scripted(mt_model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, tokenizer=tok,
                  multi_turn=MultiTurnConfig(enable=True), tools={"calculator": calculator}, script=script,
                  max_num_batched_tokens=64, enable_prefix_caching=False, **kwargs)
    bursts: list[int] = []
    inner = ro._launch_burst

    def record(runner, out, k, params, **kw):
        bursts.append(k)
        return inner(runner, out, k, params, **kw)

    ro._launch_burst = record
    out = ro.generate(text_prompts(tok, PROMPTS), SamplingParams(temperature=1.0, max_new_tokens=200))
    assert max(bursts) == cap
    assert out["responses"][0, :len(long_turn)].tolist() == long_turn


def test_turn_burst_below_one_is_refused(tiny_tokenizer, mt_model, calculator, scripted):
    tok = tiny_tokenizer
    with pytest.raises(ValueError, match="turn_burst"):
        scripted(mt_model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, tokenizer=tok,
                 multi_turn=MultiTurnConfig(enable=True), tools={"calculator": calculator}, script={}, turn_burst=0)

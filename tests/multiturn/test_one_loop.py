"""The agent loop runs on the single-turn engine loop (overlapped steps, decode bursts, KV reuse): each
model turn it generates greedily must equal what the plain single-turn ``generate`` gives for the same
context re-prefilled from scratch (prompt plus every earlier turn and inserted turn), tokens and log-probs.
With tool calls that return at once (``sync``), a sequence must still not rejoin while a launched step
that held it is unread (its tokens for it would land in the next turn)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
import torch
from helpers import text_prompts

from rlforge.batch import Batch
from rlforge.interactions import BaseInteraction
from rlforge.rollout import SamplingParams
from rlforge.rollout.multi_turn import native as mt_native
from rlforge.rollout.multi_turn.config import MultiTurnConfig
from rlforge.rollout.multi_turn.native import MultiTurnNativeRollout
from rlforge.rollout.native import NativeRollout

CPU = torch.device("cpu")
TEXTS = ["What is 2 + 3?", "Compute the sum of seven and eleven, then subtract four from it please.", "Hi", "x y"]


def _one_row(ids: list[int]) -> Batch:
    t = torch.tensor([ids])
    m = torch.ones_like(t)
    return Batch.from_dict({"input_ids": t, "attention_mask": m, "position_ids": m.cumsum(1) - 1})


class SyncPool:
    """A thread pool stand-in whose calls are done when submitted."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def submit(self, fn, *args) -> Future:
        f: Future = Future()
        f.set_result(fn(*args))
        return f

    def shutdown(self, wait: bool = True) -> None:
        pass


class More(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kwargs):
        return False, "more " * (1 + len(messages) % 3), 0.0, {}


@pytest.mark.parametrize("sync", [False, True])
@pytest.mark.parametrize("kw", [{}, {"max_decode_burst": 3, "max_num_batched_tokens": 8}, {"overlap_steps": False}])
def test_each_turn_equals_single_turn_generation_on_its_context(tiny_tokenizer, mt_model, monkeypatch, kw, sync):
    if sync:
        monkeypatch.setattr(mt_native, "ThreadPoolExecutor", SyncPool)
    tok = tiny_tokenizer
    prompts = text_prompts(tok, TEXTS)
    # tokens the model picks early on also end a turn, so that turns end inside bursts on a sampled token
    probe = NativeRollout(mt_model, [], tok.pad_token_id, CPU, progress=False).generate(
        prompts, SamplingParams(temperature=0.0, max_new_tokens=6))["responses"]
    eos = [tok.eos_token_id, *{int(probe[r, c]) for r, c in [(0, 3), (1, 5), (2, 2)]}]
    mt = MultiTurnConfig(enable=True, max_tokens_per_turn=7, max_assistant_turns=3)
    ro = MultiTurnNativeRollout(mt_model, eos, tok.pad_token_id, CPU, progress=False, tokenizer=tok, multi_turn=mt,
                                interactions={"more": More({})}, calculate_log_probs=True, **kw)
    out = ro.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=60))
    single = NativeRollout(mt_model, eos, tok.pad_token_id, CPU, progress=False, calculate_log_probs=True)
    w = prompts["input_ids"].shape[1]
    turns = 0
    for row in range(len(TEXTS)):
        p = prompts["input_ids"][row][prompts["attention_mask"][row].bool()].tolist()
        n = int(out["attention_mask"][row, w:].sum())
        resp, mask = out["responses"][row, :n].tolist(), out["response_mask"][row, :n].tolist()
        lp = out["rollout_log_probs"][row, :n]
        starts = [j for j in range(n) if mask[j] and (j == 0 or not mask[j - 1])]
        for a in starts:
            b = next((j for j in range(a, n) if not mask[j]), n)
            ctx = p + resp[:a]
            ref = single.generate(_one_row(ctx), SamplingParams(temperature=0.0, max_new_tokens=b - a))
            assert ref["responses"][0, : b - a].tolist() == resp[a:b], (row, a)
            assert (ref["rollout_log_probs"][0, : b - a] - lp[a:b]).abs().max() < 1e-4
            turns += 1
    assert turns >= 2 * len(TEXTS)  # several turns per row, each resumed on its cached history


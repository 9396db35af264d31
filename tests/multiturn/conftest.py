"""Fixtures of the multi-turn tests: ``preset:tiny``, a calculator tool, and a scripted-sampler rollout.

:class:`ScriptedRollout` is a :class:`MultiTurnNativeRollout` whose sampler emits scripted tokens.  The
engine runs for real (paged KV cache, chunked prefill of inserted turns, decode bursts); only the token
choice is forced, and the log-prob reported for each forced token is the engine's own
``log_softmax(logits / T)`` at that token, so trainer-vs-rollout log-prob checks test the KV reuse.
"""

from __future__ import annotations

import pytest
import torch
from turn_plan import TurnPlan

from rlforge.models import load_causal_lm
from rlforge.rollout.multi_turn.native import MultiTurnNativeRollout
from rlforge.rollout.native import engine as native_engine
from rlforge.tools import parse_tool_schema
from rlforge.tools.calculator import CalculatorTool

CALC_SCHEMA = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}


@pytest.fixture(scope="module")
def mt_model(tiny_tokenizer):
    """``preset:tiny`` in float32 with varied random weights, eval mode."""
    return load_causal_lm("preset:tiny", tiny_tokenizer, {"initializer_range": 0.2}, seed=0).eval()


@pytest.fixture()
def calculator():
    return CalculatorTool({}, parse_tool_schema(CALC_SCHEMA))


class ScriptedRollout(TurnPlan, MultiTurnNativeRollout):
    """``script[row]`` lists the row's model turns, each a list of ids (EOS included where the turn ends)."""

    def __init__(self, *args, script: dict[int, list[list[int]]], **kwargs) -> None:
        super().__init__(*args, calculate_log_probs=True, **kwargs)
        self.script = script
        self.turn_of: dict[int, int] = {}
        self._order: list[tuple[int, int]] = []  # (seq id, index in its current turn) per sampled row
        self._j = 0

    def _turn_start_of(self, seq_id: int) -> int:
        return self._turn_start.get(seq_id, 0)

    def forced(self, logits: torch.Tensor, params, generator, calc):
        lp_all = torch.log_softmax(logits.float() / max(params.temperature, 1e-6), dim=-1)
        toks = []
        for sid, i in self._order:
            turns = self.script[sid]
            t = self.turn_of.get(sid, 0)
            turn = turns[t] if t < len(turns) else [self.eos_ids[0]]
            toks.append(turn[i + self._j] if i + self._j < len(turn) else self.eos_ids[0])
        self._j += 1
        tok = torch.tensor(toks, dtype=torch.long, device=logits.device)
        return tok, lp_all.gather(1, tok[:, None]).squeeze(1), torch.ones((), dtype=torch.bool)


def install(monkeypatch, rollout: ScriptedRollout) -> None:
    """Route the engine's sampler to ``rollout.forced`` and track each row's turn index."""
    rollout._turn_start = {}
    monkeypatch.setattr(native_engine, "sample_with_log_probs", rollout.forced)
    orig = rollout._insert

    def _insert(sched, convs, seq, messages):
        orig(sched, convs, seq, messages)
        rollout.turn_of[seq.seq_id] = rollout.turn_of.get(seq.seq_id, 0) + 1
        rollout._turn_start[seq.seq_id] = convs[seq.seq_id].turn_start

    monkeypatch.setattr(rollout, "_insert", _insert)


@pytest.fixture()
def scripted(monkeypatch):
    """``scripted(*args, script=..., **kwargs)``: a :class:`ScriptedRollout` with the sampler routed to it."""

    def make(*args, **kwargs):
        ro = ScriptedRollout(*args, **kwargs)
        install(monkeypatch, ro)
        return ro

    return make

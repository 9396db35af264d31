"""A short CPU run on ``builtin:tool_arithmetic`` in which the score with tools rises over the steps.

A random ``preset:tiny`` model cannot learn to write a tool call in a few steps, so the policy is a
*biased two-way choice* on top of the real model (:class:`ToolChoicePolicy`): at the first token of its
first turn each sample either starts the calculator call for its own question or starts a guess, with

    p(tool) = sigmoid((z_tool - z_guess) / T - BIAS)

where ``z`` are the model's logits at that position for the first token of each branch.  ``BIAS`` makes
the untrained policy call the tool about one time in six (SmolLM2-135M-Instruct's rate on this task is
one in eight).  The rest of each branch is forced: the call ``<tool_call>{... "a * b" ...}</tool_call>``
and, after the calculator's response, the answer it returned; or a wrong guess.  Everything else is the
real job: the agent loop parses the call and runs the calculator, the tool response is inserted by the
chat template, the reward reads the model's tokens only, GRPO and the actor update train the logits.
So the score can rise only if the tool call is parsed and run, the sample is scored 1 exactly when it
called the calculator and restated its result (checked step by step against the tool-call metrics),
and GRPO and the update on the multi-turn sequence (sampled plus inserted ids, ``response_mask``) raise
``z_tool - z_guess``; a wrong advantage sign, a mask that trains on the wrong tokens or a reward that
misses the answer stops the rise.  Seeded, so the numbers repeat on one machine; the thresholds leave
room for other machines (measured: mean p(tool) 0.156, 0.310, 0.378, 0.466 over the 4 steps).
"""

from __future__ import annotations

import json
import re
from itertools import pairwise

import pytest
import torch
from turn_plan import TurnPlan

from rlforge.cli import main
from rlforge.rollout.multi_turn import native as mt_native
from rlforge.rollout.native import engine as native_engine

pytestmark = pytest.mark.e2e

BIAS = 1.6  # sigmoid(-1.6) = 0.17 at z_tool == z_guess
STEPS = 4
R = "actor_rollout_ref.rollout"
ARGS = [
    "actor_rollout_ref.model.path=preset:tiny", "trainer.device=cpu",
    "data.train_files=builtin:tool_arithmetic", "data.val_files=builtin:tool_arithmetic",
    "data.builtin.difficulty=1", "data.builtin.train_size=64", "data.builtin.val_size=8",
    "data.train_batch_size=4", f"{R}.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", "actor_rollout_ref.actor.optim.lr=1e-2",
    "data.max_response_length=64", "data.max_prompt_length=256", "data.val_batch_size=8",
    f"trainer.total_training_steps={STEPS}", "trainer.val_before_train=true", f"trainer.test_freq={STEPS}",
    "trainer.logger=[file]", "trainer.save_freq=-1", f"{R}.name=native", f"{R}.temperature=1.0",
    f"+{R}.multi_turn.enable=true", f"+{R}.multi_turn.tool_config_path=builtin:calculator",
    f"+{R}.multi_turn.max_assistant_turns=3",
]
QUESTION = re.compile(r"What is (\d+) \* (\d+)\?")


class ToolChoicePolicy(TurnPlan, mt_native.MultiTurnNativeRollout):
    """The agent loop with the biased tool-or-guess sampler of the module docstring."""

    @classmethod
    def from_native(cls, native, **kwargs):
        obj = super().from_native(native, **kwargs)
        obj.tok = kwargs["tokenizer"]
        obj.branch: dict[int, str] = {}
        obj.turn_of: dict[int, int] = {}
        obj.turn_start: dict[int, int] = {}
        obj.p_tool: list[tuple[bool, float]] = []  # (greedy, mean p(tool) over the rows) per generate call
        ACTIVE[:] = [obj]
        return obj

    def _ids(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def generate(self, prompts, params):
        self.scripts = {}
        for i, row in enumerate(prompts["input_ids"]):
            a, b = (int(x) for x in QUESTION.findall(self.tok.decode(row, skip_special_tokens=True))[-1])
            call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}})
            self.scripts[i] = {"tool": [self._ids(f"<tool_call>{call}</tool_call>"), self._ids(str(a * b))],
                               "guess": [self._ids(f"The answer is {a * b + 1}")]}
        tool0, guess0 = self.scripts[0]["tool"][0][0], self.scripts[0]["guess"][0][0]
        assert tool0 != guess0 and all(s["tool"][0][0] == tool0 and s["guess"][0][0] == guess0
                                       for s in self.scripts.values())
        self.first = (tool0, guess0)
        self.branch, self.turn_of, self.turn_start, self.choices = {}, {}, {}, []
        out = super().generate(prompts, params)
        self.p_tool.append((params.greedy, sum(self.choices) / len(self.choices)))
        return out

    def _turn_start_of(self, seq_id: int) -> int:
        return self.turn_start.get(seq_id, 0)

    def _insert(self, sched, convs, seq, messages):
        super()._insert(sched, convs, seq, messages)
        self.turn_of[seq.seq_id] = self.turn_of.get(seq.seq_id, 0) + 1
        self.turn_start[seq.seq_id] = convs[seq.seq_id].turn_start

    def sample(self, logits: torch.Tensor, params, generator, calc):
        t = max(params.temperature, 1e-6)
        lp_all = torch.log_softmax(logits.float() / t, dim=-1)
        eos = self.eos_ids[0]
        toks = []
        for r, (sid, i) in enumerate(self._order):
            pos = i + self._j
            if self.turn_of.get(sid, 0) == 0 and pos == 0:
                zt, zg = (float(logits[r, x]) for x in self.first)
                p_tool = float(torch.sigmoid(torch.tensor((zt - zg) / t - BIAS)))
                draw = 0.0 if params.greedy else float(torch.rand((), generator=generator))
                use_tool = p_tool > 0.5 if params.greedy else draw < p_tool
                self.branch[sid] = "tool" if use_tool else "guess"
                self.choices.append(p_tool)
            turns = self.scripts[sid][self.branch[sid]]
            turn = turns[self.turn_of.get(sid, 0)] if self.turn_of.get(sid, 0) < len(turns) else []
            toks.append(turn[pos] if pos < len(turn) else eos)
        self._j += 1
        tok = torch.tensor(toks, dtype=torch.long, device=logits.device)
        return tok, lp_all.gather(1, tok[:, None]).squeeze(1), torch.ones((), dtype=torch.bool)


ACTIVE: list[ToolChoicePolicy] = []


def test_score_with_tools_rises(tmp_path, monkeypatch):
    monkeypatch.setattr(mt_native, "MultiTurnNativeRollout", ToolChoicePolicy)
    monkeypatch.setattr(native_engine, "sample_with_log_probs", lambda *a: ACTIVE[0].sample(*a))
    assert main(["train", *ARGS, f"trainer.default_local_dir={tmp_path}"]) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "critic/score/mean" in r]
    val = [r["val-core/rlforge/arithmetic/reward/mean@1"] for r in rows if "val-core/rlforge/arithmetic/reward/mean@1" in r]
    score = [r["critic/score/mean"] for r in train]
    calls = [r["multi_turn/tool_calls/mean"] for r in train]
    p_train = [p for greedy, p in ACTIVE[0].p_tool if not greedy]
    print("train score per step", score, "| mean p(tool) per step", [round(p, 3) for p in p_train],
          "| val (greedy) before/after", val)
    assert len(score) == len(p_train) == STEPS and len(val) == 2
    # every sample that called the calculator and restated its result scores 1, every guess 0
    assert score == calls
    assert all(r["multi_turn/tool/calculator/success"] == r["multi_turn/tool/calculator/calls"] for r in train)
    # the rise: the untrained policy mostly guesses (p(tool) = 0.17); a few GRPO steps make it call the tool
    assert abs(p_train[0] - 0.17) < 0.05 and p_train[-1] > 2 * p_train[0]
    assert all(b > a for a, b in pairwise(p_train))
    assert score[-1] > score[0]
    assert val[0] == 0.0 and val[-1] == 1.0  # greedy: guesses before training, the tool after

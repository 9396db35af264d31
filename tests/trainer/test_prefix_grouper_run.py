"""``actor_rollout_ref.actor.use_prefix_grouper``: a seeded RL step with the prompt of each group run
once equals the same step without sharing (rollout, old log-probs, loss, gradient norm, KL), with
token-budget micro-batches and the padding-free forward on ``rlforge_varlen`` (chosen on CPU by
``override_config``); the shared layout must actually have been used.  Where the key cannot take
effect, a warning says why."""

from __future__ import annotations

import json
import warnings

import pytest

from rlforge.cli import main
from rlforge.engine import packing
from rlforge.trainer.builders.engines import prefix_grouper

BASE = [
    "actor_rollout_ref.model.path=preset:tiny",
    "+actor_rollout_ref.model.override_config.initializer_range=0.2",
    "+actor_rollout_ref.model.override_config.attn_implementation=rlforge_varlen",
    "trainer.device=cpu",
    "data.train_batch_size=3",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=3",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=12",
    "data.max_response_length=8",
    "data.max_prompt_length=64",
    "data.builtin.train_size=12",
    "trainer.total_training_steps=1",
    "trainer.val_before_train=false",
    "trainer.logger=[file]",
    "actor_rollout_ref.actor.entropy_coeff=0.01",
    "actor_rollout_ref.actor.recompute_old_log_prob=true",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=200",
    "actor_rollout_ref.model.use_remove_padding=true",
]


def step(tmp, *extra):
    assert main(["train", *BASE, f"trainer.default_local_dir={tmp}", *extra]) == 0
    return json.loads((tmp / "metrics.jsonl").read_text().splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.parametrize("choice", ["true", "default"])
def test_shared_prompts_step_equals_unshared(tmp_path, monkeypatch, choice):
    """``true``, and the default (None: on wherever it can take effect), against ``false``."""
    ref = step(tmp_path / "plain", "actor_rollout_ref.actor.use_prefix_grouper=false")
    shared_plans = []
    real = packing._shared_plan

    def spy(mb):
        plan = real(mb)
        if plan is not None:
            shared_plans.append(int(plan.flat.numel()) < int(mb["attention_mask"].sum()))
        return plan

    monkeypatch.setattr(packing, "_shared_plan", spy)
    got = step(tmp_path / "shared", *(["actor_rollout_ref.actor.use_prefix_grouper=true"] if choice == "true" else []))
    assert shared_plans and all(shared_plans)  # the shared layout ran, on fewer tokens
    # 3 prompts x 4 rows, every group in one micro-batch: 3 prompt copies of each group not computed
    assert got["perf/prefix_grouper/saved_tokens"] == pytest.approx(9 * got["prompt_length/mean"])
    assert "perf/prefix_grouper/saved_tokens" not in ref
    assert got["response_length/mean"] == ref["response_length/mean"]
    for key in ("actor/entropy", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl", "actor/kl_loss"):
        assert got[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), key


def test_where_it_cannot_take_effect(tiny_tokenizer):
    from rlforge.models import load_causal_lm

    sdpa = load_causal_lm("preset:tiny", tiny_tokenizer, {}, seed=1)
    with pytest.warns(UserWarning, match="use_prefix_grouper=True needs the 'rlforge_varlen' attention"):
        assert prefix_grouper(sdpa, packed=True, choice=True, n=4) is False
    varlen = load_causal_lm("preset:tiny", tiny_tokenizer, {"attn_implementation": "rlforge_varlen"}, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the padded forward: config.later_work has already warned
        assert prefix_grouper(sdpa, packed=False, choice=True, n=4) is False
        # the default warns nowhere: off on other attention, off with one response per prompt
        assert prefix_grouper(sdpa, packed=True, choice=None, n=4) is False
        assert prefix_grouper(varlen, packed=True, choice=None, n=1) is False
        assert prefix_grouper(varlen, packed=False, choice=None, n=4) is False
        assert prefix_grouper(varlen, packed=True, choice=False, n=4) is False
    assert prefix_grouper(varlen, packed=True, choice=True, n=4) is True
    assert prefix_grouper(varlen, packed=True, choice=None, n=4) is True
    assert prefix_grouper(varlen, packed=True, choice=True, n=1) is True  # asked for: nothing to share, harmless

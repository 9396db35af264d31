"""The megatron engine's width-trimmed, length-sorted micro-batches (rlforge/engine/megatron/inputs.py)
against the untrimmed batch: hand-checked widths, a round trip through ``align_widths``, and the
padded token budget on random lengths."""

from __future__ import annotations

import random

import pytest
import torch
from helpers import left_padded_batch

from rlforge.batch import Batch
from rlforge.engine.megatron.inputs import align_widths, length_sorted_micro_batches, trim_widths

KEY = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"


def _batch(p_lens: list[int], eos_at: list[int | None], resp_len: int, seed: int = 0) -> Batch:
    b = left_padded_batch(0, 2, p_lens, eos_at, resp_len, seed)
    b["old_log_probs"] = torch.randn(len(p_lens), resp_len)
    return b


def test_trim_cuts_only_padding_and_round_trips():
    # prompts of 3 and 2 tokens in a width of 5; responses end after 3 and 5 tokens (EOS at 2 and 4) of 8
    b = _batch([5, 3, 2], [0, 2, 4], 8).select([1, 2])
    t = trim_widths(b)
    assert t["prompts"].shape == (2, 3) and t["responses"].shape == (2, 5) and t["input_ids"].shape == (2, 8)
    assert t["old_log_probs"].shape == (2, 5)
    assert int(t["attention_mask"].sum()) == int(b["attention_mask"].sum())  # no token lost
    back = align_widths([t, b])[0]  # padded again to the original widths
    for k in ("prompts", "responses", "input_ids", "attention_mask", "response_mask"):
        assert torch.equal(back[k], b[k]), k
    on = b["attention_mask"].bool()
    assert torch.equal(back["position_ids"][on], b["position_ids"][on])
    assert torch.equal(back["old_log_probs"][:, :5], b["old_log_probs"][:, :5])


def test_trim_keeps_a_batch_that_is_already_tight():
    b = _batch([4, 4], [None, None], 6)
    assert trim_widths(b) is b


def test_length_sorted_micro_batches_fit_the_padded_budget_on_random_lengths():
    rng = random.Random(0)
    for case in range(30):
        n = rng.randint(1, 24)
        p_lens = [rng.randint(1, 12) for _ in range(n)]
        eos = [rng.choice([None, *range(20)]) for _ in range(n)]
        b = _batch(p_lens, eos, 20, seed=case)
        lens = b["attention_mask"].sum(1).tolist()
        budget = rng.randint(max(lens), 4 * max(lens))
        parts, order = length_sorted_micro_batches(b, budget, KEY)
        assert sorted(order) == list(range(n))  # every row exactly once
        for part in parts:
            t = trim_widths(part)
            assert len(t) * t["input_ids"].shape[1] <= budget  # the padded cost, after trimming
        firsts = [lens[order[sum(len(p) for p in parts[:k])]] for k in range(len(parts))]
        assert firsts == sorted(firsts, reverse=True)  # longest rows first


def test_length_sorted_refuses_a_row_over_the_budget():
    b = _batch([3, 3], [None, 1], 6)
    with pytest.raises(ValueError, match=f"sequence 0 has 9 tokens, more than {KEY}=8"):
        length_sorted_micro_batches(b, 8, KEY)

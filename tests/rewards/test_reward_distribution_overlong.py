"""The distribution task's target and reward, the integers tokenizer, and DAPO's overlong penalty."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlforge.data.tasks.distribution import generate_distribution, log_target, target_probs, target_spec
from rlforge.errors import ConfigError
from rlforge.models import load_tokenizer
from rlforge.rewards.overlong import overlong_penalty
from rlforge.rewards.rules import default_compute_score

PARAMS = SimpleNamespace(weights=[0.25, 0.5, 0.25], means=[20, 50, 80], width=10.0, low=1, high=100,
                         invalid_reward=-50.0)


def test_target_is_the_normalised_mixture():
    spec = target_spec(PARAMS)
    p = target_probs(spec)
    xs = np.arange(1, 101)
    raw = sum(w * np.exp(-((xs - m) ** 2) / 10.0) for w, m in zip([0.25, 0.5, 0.25], [20, 50, 80], strict=True))
    np.testing.assert_allclose(p, raw / raw.sum(), rtol=1e-12)
    assert p.sum() == pytest.approx(1.0)
    assert p.argmax() + 1 == 50
    # each side mode holds about a quarter of the mass
    assert p[:35].sum() == pytest.approx(0.25, abs=1e-3)


def test_reward_rule_is_log_target_and_invalid_is_fixed():
    row = generate_distribution(split="train", size=3, difficulty=1, seed=0, builtin=SimpleNamespace(distribution=PARAMS))[0]
    truth = row["reward_model"]["ground_truth"]
    p = target_probs(json.loads(truth))
    score = default_compute_score(row["data_source"], " 20 ", truth)
    assert score == pytest.approx(math.log(p[19]))
    assert log_target(json.loads(truth), 0) == -50.0
    assert default_compute_score(row["data_source"], "Pick", truth) == -50.0
    assert default_compute_score(row["data_source"], "101", truth) == -50.0


def test_bad_mixture_is_a_config_error():
    bad = SimpleNamespace(**{**vars(PARAMS), "weights": [1.0, 2.0]})
    with pytest.raises(ConfigError, match="data.builtin.distribution"):
        target_spec(bad)


def test_integers_tokenizer_has_one_token_per_integer():
    tok = load_tokenizer("preset:tiny", "builtin:integers")
    ids = [tok.encode(str(x), add_special_tokens=False) for x in range(0, 101)]
    assert all(len(i) == 1 for i in ids)
    assert len({i[0] for i in ids}) == 101
    assert tok.decode(ids[42]) == "42"
    assert tok.eos_token_id != tok.pad_token_id


def test_overlong_penalty_hand_case():
    pen = overlong_penalty(torch.tensor([5, 6, 7, 10]), max_response_length=10, buffer_len=4, penalty_factor=1.0)
    assert pen.tolist() == pytest.approx([0.0, 0.0, -0.25, -1.0])
    with pytest.raises(ValueError, match="overlong_buffer.len"):
        overlong_penalty(torch.tensor([1]), 10, 0, 1.0)

"""Hand-computed cases for rloo, reinforce++ (and -baseline), remax, opo, gpg, grpo_passk, Dr.GRPO."""

import math
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlforge.algorithms import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    PolicyLossInputs,
    compute_advantage,
    compute_policy_loss,
)
from rlforge.config import load_config
from rlforge.errors import ConfigError


def _cfg(name, gamma=1.0, norm=True):
    return SimpleNamespace(adv_estimator=name, gamma=gamma, lam=1.0, norm_adv_by_std_in_grpo=norm)


def _outcome_batch(scores, lengths, index, r=3):
    mask = (torch.arange(r)[None, :] < torch.tensor(lengths)[:, None]).float()
    rewards = torch.zeros(len(scores), r)
    for i, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        rewards[i, n - 1] = s
    return AdvantageInputs(token_level_rewards=rewards, response_mask=mask, index=np.array(index, dtype=object))


# group a: scores 3, 1, 2 (lengths 3, 1, 2); group b: one response, score 5; group c: scores 0, 4 (lengths 3, 1)
SCORES, LENGTHS, INDEX = [3.0, 1.0, 2.0, 5.0, 0.0, 4.0], [3, 1, 2, 2, 3, 1], ["a", "a", "a", "b", "c", "c"]


def _check_broadcast(adv, inputs, expected):
    for i, e in enumerate(expected):
        valid = inputs.response_mask[i].bool()
        torch.testing.assert_close(adv[i][valid], torch.full((int(valid.sum()),), float(e)), atol=1e-5, rtol=0)
        assert torch.all(adv[i][~valid] == 0)


def test_rloo_leave_one_out():
    inputs = _outcome_batch(SCORES, LENGTHS, INDEX)
    adv, ret = compute_advantage(inputs, _cfg("rloo"))
    # a: 3 - mean(1, 2) = 1.5, 1 - mean(3, 2) = -1.5, 2 - mean(3, 1) = 0; b (size 1): raw score 5;
    # c: 0 - 4 = -4, 4 - 0 = 4
    _check_broadcast(adv, inputs, [1.5, -1.5, 0.0, 5.0, -4.0, 4.0])
    torch.testing.assert_close(ret, adv)


def test_opo_length_weighted_baseline():
    inputs = _outcome_batch(SCORES, LENGTHS, INDEX)
    adv, _ = compute_advantage(inputs, _cfg("opo"))
    b_a = (3 * 3 + 1 * 1 + 2 * 2) / 6  # sum L r / sum L = 14 / 6
    b_c = (3 * 0 + 1 * 4) / 4
    _check_broadcast(adv, inputs, [3 - b_a, 1 - b_a, 2 - b_a, 5.0, 0 - b_c, 4 - b_c])


def test_gpg_alpha_counts_nonzero_scores():
    inputs = _outcome_batch(SCORES, LENGTHS, INDEX)
    adv, _ = compute_advantage(inputs, _cfg("gpg"))
    alpha = 6 / 5  # B = 6, five non-zero scores (verl's count_nonzero)
    # group means: a 2, b 0 (size 1), c 2
    _check_broadcast(adv, inputs, [alpha * v for v in (1.0, -1.0, 0.0, 5.0, -2.0, 2.0)])


def test_gpg_all_zero_scores_no_division_by_zero():
    inputs = _outcome_batch([0.0, 0.0], [1, 2], ["a", "a"])
    adv, _ = compute_advantage(inputs, _cfg("gpg"))
    assert torch.all(adv == 0)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_only_best_gets_gap(norm):
    inputs = _outcome_batch([3.0, 1.0, 2.0, 0.0, 4.0], [3, 1, 2, 3, 1], ["a", "a", "a", "c", "c"])
    adv, ret = compute_advantage(inputs, _cfg("grpo_passk", norm=norm))
    std_a, std_c = statistics.stdev([3, 1, 2]), statistics.stdev([0, 4])
    gap_a, gap_c = (1 / (std_a + 1e-6), 4 / (std_c + 1e-6)) if norm else (1.0, 4.0)
    _check_broadcast(adv, inputs, [gap_a, 0.0, 0.0, 0.0, gap_c])
    torch.testing.assert_close(ret, adv)


def test_grpo_passk_tie_goes_to_first_and_size_one_raises():
    inputs = _outcome_batch([2.0, 2.0, 0.0], [1, 1, 1], ["a", "a", "a"])
    adv, _ = compute_advantage(inputs, _cfg("grpo_passk"))
    assert torch.all(adv == 0)  # max - second max = 0
    inputs = _outcome_batch([2.0, 0.0, 1.0], [1, 1, 1], ["a", "a", "b"])
    with pytest.raises(ConfigError, match="rollout.n >= 2"):
        compute_advantage(inputs, _cfg("grpo_passk"))


def test_reinforce_plus_plus_discount_reset_and_whiten():
    rewards = torch.tensor([[1.0, 0.0, 2.0], [0.0, 3.0, 7.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    adv, ret = compute_advantage(AdvantageInputs(rewards, mask), _cfg("reinforce_plus_plus", gamma=0.5))
    # row 0: G = [1 + 0.5 * (0 + 0.5 * 2), 0 + 0.5 * 2, 2]; row 1: the 7 sits on a masked token and
    # the running return is reset there, so G = [0 + 0.5 * 3, 3, (masked)]
    expected_ret = torch.tensor([[1.5, 1.0, 2.0], [1.5, 3.0, 0.0]])
    torch.testing.assert_close(ret, expected_ret)
    valid = [1.5, 1.0, 2.0, 1.5, 3.0]
    mu, sd = statistics.mean(valid), math.sqrt(statistics.variance(valid) + 1e-8)
    expected_adv = torch.tensor([[(v - mu) / sd for v in valid[:3]], [(valid[3] - mu) / sd, (valid[4] - mu) / sd, 0]])
    torch.testing.assert_close(adv, expected_adv, atol=1e-5, rtol=0)


def test_reinforce_plus_plus_single_token_batch_is_zero():
    adv, ret = compute_advantage(
        AdvantageInputs(torch.tensor([[2.0, 0.0]]), torch.tensor([[1.0, 0.0]])), _cfg("reinforce_plus_plus")
    )
    assert torch.all(adv == 0) and ret[0, 0].item() == 2.0


def test_reinforce_plus_plus_baseline():
    inputs = _outcome_batch(SCORES, LENGTHS, INDEX)
    adv, ret = compute_advantage(inputs, _cfg("reinforce_plus_plus_baseline"))
    centered = [1.0, -1.0, 0.0, 5.0, -2.0, 2.0]  # size-1 group b keeps its score (mean 0)
    tokens = [c for c, n in zip(centered, LENGTHS, strict=True) for _ in range(n)]
    mu, sd = statistics.mean(tokens), math.sqrt(statistics.variance(tokens) + 1e-8)
    _check_broadcast(adv, inputs, [(c - mu) / sd for c in centered])
    torch.testing.assert_close(ret, adv)


def test_remax_uses_greedy_baseline():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0]])
    inputs = AdvantageInputs(rewards, mask, reward_baselines=torch.tensor([0.5, 3.0]))
    adv, ret = compute_advantage(inputs, _cfg("remax"))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5], [-1.0, -1.0, 0.0]]))


def test_remax_needs_baselines():
    inputs = AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(ConfigError, match="reward_baselines"):
        compute_advantage(inputs, _cfg("remax"))
    with pytest.raises(ValueError, match="reward_baselines"):
        AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3), reward_baselines=torch.zeros(3))


@pytest.mark.parametrize("name", ["rloo", "reinforce_plus_plus_baseline", "opo", "gpg"])
def test_group_estimators_need_index(name):
    with pytest.raises(ConfigError, match=name):
        compute_advantage(AdvantageInputs(torch.zeros(2, 3), torch.ones(2, 3)), _cfg(name))


@pytest.mark.parametrize(
    "name", ["grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg"]
)
def test_groups_of_one_are_finite(name):
    inputs = _outcome_batch([1.0, 0.0, 2.0], [2, 3, 1], ["a", "b", "c"])
    inputs.reward_baselines = torch.tensor([0.5, 0.5, 0.5])
    adv, ret = compute_advantage(inputs, _cfg(name))
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert adv.abs().sum() > 0


def test_every_estimator_registered():
    assert set(ADV_ESTIMATORS.names()) == {
        "gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo", "gpg",
        "grpo_passk", "gdpo", "optimal_token_baseline", "tir_optimal_token_baseline",
    }


def test_dr_grpo_settings():
    """Dr.GRPO = grpo + norm_adv_by_std_in_grpo=false + loss_agg_mode=seq-mean-token-sum-norm."""
    cfg = load_config(
        ["algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=false",
         "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"],
        job="default",
    )
    inputs = _outcome_batch([1.0, 0.0, 0.0, 1.0], [1, 3, 2, 3], ["a", "a", "b", "b"], r=4)
    adv, _ = compute_advantage(inputs, cfg.algorithm)
    _check_broadcast(adv, inputs, [0.5, -0.5, -0.5, 0.5])  # r - mean, no std division

    actor = cfg.actor_rollout_ref.actor
    old = torch.full((4, 4), -1.0)
    log_prob = old.clone().requires_grad_(True)
    pl = PolicyLossInputs(old, log_prob, adv, inputs.response_mask, loss_agg_mode=actor.loss_agg_mode)
    loss = compute_policy_loss(pl, actor)
    # ratio 1: loss = -sum_i sum_t A_i / (horizon * num_seqs) = -(0.5 - 1.5 - 1 + 1.5) / (4 * 4)
    assert loss.loss.item() == pytest.approx(0.5 / 16)
    loss.loss.backward()
    # every valid token gets -A_i / (horizon * num_seqs), whatever its sequence's length
    expected = -adv / 16
    torch.testing.assert_close(log_prob.grad, expected)
    assert log_prob.grad[0, 0].item() == pytest.approx(-log_prob.grad[1, 0].item())  # lengths 1 vs 3

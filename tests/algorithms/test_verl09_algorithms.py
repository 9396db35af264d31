"""verl 0.9's newer algorithms against hand-computed values: ``token-sum`` aggregation, the
``dppo_tv`` / ``dppo_kl`` / ``dro`` losses and the ``optimal_token_baseline`` /
``tir_optimal_token_baseline`` / ``gdpo`` estimators.  Every expected number is worked out in
the comments from the papers' formulas (see each function's docstring), not by the code under test.
"""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlforge.algorithms import (
    ADV_ESTIMATORS,
    POLICY_LOSSES,
    AdvantageInputs,
    PolicyLossInputs,
    agg_loss,
)
from rlforge.algorithms.log_probs import sum_pi_squared_from_logits
from rlforge.errors import ConfigError

D = torch.float64


def _actor(low=0.1, high=0.1, c=3.0, dro_beta=None):
    return SimpleNamespace(clip_ratio=0.2, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c,
                           policy_loss=SimpleNamespace(dro_beta=dro_beta))


def _loss(name, p, q, adv, cfg, mode="token-mean"):
    logp = torch.tensor([p], dtype=D).log().requires_grad_(True)
    inputs = PolicyLossInputs(torch.tensor([q], dtype=D).log(), logp, torch.tensor([adv], dtype=D),
                              torch.ones(1, len(p), dtype=D), mode)
    out = POLICY_LOSSES.get(name)(inputs, cfg)
    out.loss.backward()
    return out, logp.grad[0]


# ------------------------------------------------------------------------------------------ token-sum

def test_token_sum_is_the_plain_sum_and_splits_exactly():
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=D)
    assert agg_loss(loss, mask, "token-sum").item() == 7.0  # 1 + 2 + 4
    # micro-batches: each row's own sum; they add up to the mini-batch sum
    assert agg_loss(loss[:1], mask[:1], "token-sum").item() + agg_loss(loss[1:], mask[1:], "token-sum").item() == 7.0
    # two data-parallel ranks average their gradients: each rank's sum counts twice
    assert agg_loss(loss, mask, "token-sum", dp_size=2).item() == 14.0


# ------------------------------------------------------------------------------------------ DPPO

def test_dppo_tv_masks_by_probability_difference():
    # thresholds 0.1; c = 3
    # t0: q .5 -> p .55, A +1: p - q = .05 <= .1 kept; r = 1.1
    # t1: q .5 -> p .7,  A +1: .2 > .1 masked
    # t2: q .5 -> p .3,  A -1: -.2 < -.1 masked
    # t3: q .1 -> p .4,  A -2: .3 >= -.1 kept; r = 4 truncated to 3
    out, grad = _loss("dppo_tv", [0.55, 0.7, 0.3, 0.4], [0.5, 0.5, 0.5, 0.1], [1.0, 1.0, -1.0, -2.0], _actor())
    hand = (-1.0 * 1.1 * math.log(0.55) + 2.0 * 3.0 * math.log(0.4)) / 4  # L = -A * min(r, c) * log p, mean of 4
    assert out.loss.item() == pytest.approx(hand, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([-1.1 / 4, 0.0, 0.0, 6.0 / 4], dtype=D))
    assert float(out.metrics["pg_clipfrac"]) == pytest.approx(0.5)  # t1, t2
    assert float(out.metrics["pg_clipfrac_lower"]) == pytest.approx(0.25)  # t3: kept, ratio truncated
    kl = (math.log(0.5 / 0.55) + math.log(0.5 / 0.7) + math.log(0.5 / 0.3) + math.log(0.1 / 0.4)) / 4
    assert float(out.metrics["ppo_kl"]) == pytest.approx(kl)


def _binary_kl(q, p):
    return q * math.log(q / p) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))


def test_dppo_kl_masks_by_binary_kl_in_the_advantages_direction():
    # q = .5 everywhere; KL_b(.5 || .55) = .00501, KL_b(.5 || .8) = KL_b(.5 || .2) = .2231; threshold .05
    assert _binary_kl(0.5, 0.55) == pytest.approx(0.005025, abs=1e-5)
    assert _binary_kl(0.5, 0.8) == pytest.approx(0.22314, abs=1e-5)
    # t0: p .55, A +1: KL small -> kept (r 1.1)
    # t1: p .8,  A +1: KL big and p > q -> masked
    # t2: p .2,  A +1: KL big but p <= q (moved against the advantage) -> kept (r .4)
    # t3: p .2,  A -1: KL big and p < q -> masked
    # t4: p .8,  A -1: p >= q -> kept (r 1.6)
    p, a = [0.55, 0.8, 0.2, 0.2, 0.8], [1.0, 1.0, 1.0, -1.0, -1.0]
    out, grad = _loss("dppo_kl", p, [0.5] * 5, a, _actor(0.05, 0.05))
    hand = (-1.1 * math.log(0.55) - 0.4 * math.log(0.2) + 1.6 * math.log(0.8)) / 5
    assert out.loss.item() == pytest.approx(hand, abs=1e-12)
    torch.testing.assert_close(grad, torch.tensor([-1.1, 0.0, -0.4, 0.0, 1.6], dtype=D) / 5)
    assert float(out.metrics["pg_clipfrac"]) == pytest.approx(0.4)
    assert float(out.metrics["pg_clipfrac_lower"]) == 0.0


# ------------------------------------------------------------------------------------------ DRO

def test_dro_quadratic_penalty_token_sum():
    # beta .5; L = -(logp * A - beta/2 (logp - old)^2)
    # t0: logp -1, old -1.5, A +1: -(-1 - .25 * .25) = 1.0625;  dL/dlogp = -A + beta (logp - old) = -.75
    # t1: logp -2, old -1,   A -1: -(2 - .25 * 1) = -1.75;      dL/dlogp = 1 + .5 * (-1) = .5
    logp = torch.tensor([[-1.0, -2.0]], dtype=D, requires_grad=True)
    inputs = PolicyLossInputs(torch.tensor([[-1.5, -1.0]], dtype=D), logp, torch.tensor([[1.0, -1.0]], dtype=D),
                              torch.ones(1, 2, dtype=D), "token-sum")
    out = POLICY_LOSSES.get("dro")(inputs, _actor(dro_beta=0.5))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(1.0625 - 1.75)
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.75, 0.5]], dtype=D))
    assert float(out.metrics["ppo_kl"]) == pytest.approx((-0.5 + 1.0) / 2)


@pytest.mark.parametrize("beta", [None, 0.0])
def test_dro_needs_a_positive_beta(beta):
    inputs = PolicyLossInputs(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1))
    with pytest.raises(ConfigError, match="policy_loss.dro_beta"):
        POLICY_LOSSES.get("dro")(inputs, _actor(dro_beta=beta))


# ------------------------------------------------------------------------------------------ OTB

def test_sum_pi_squared_from_logits():
    # softmax([0, ln 3]) = (1/4, 3/4): 1/16 + 9/16
    assert sum_pi_squared_from_logits(torch.tensor([[[0.0, math.log(3.0)]]])).item() == pytest.approx(0.625)


def _otb_inputs(mask, rewards, w_valid):
    """Per-token proxy w = 1 - 2 pi + sum pi^2: pi = .25, sum pi^2 = .5 gives w = 1; pi = .5 gives w = .5."""
    mask = torch.tensor(mask, dtype=D)
    pi = torch.full_like(mask, 0.5)
    for (i, j), w in w_valid.items():
        pi[i, j] = 0.25 if w == 1.0 else 0.5
    return AdvantageInputs(torch.tensor(rewards, dtype=D), mask, index=np.array(["a", "a", "b"], dtype=object),
                           old_log_probs=pi.log(), sum_pi_squared=torch.full_like(mask, 0.5))


# rows 0, 1 share a prompt, row 2 is alone.  Row 0: 3 tokens, reward 1 at the end, w = 1, .5, .5
# (W = 1, 1.5, 2); row 1: 2 tokens, reward 2, w = .5, .5 (W = .5, 1); row 2: reward 3 (alone: A = G).
# B_0 = (1*1 + 2*.5) / 1.5 = 4/3; B_1 = (1*1.5 + 2*1) / 2.5 = 1.4; B_2 = 0 for row 0 (the unique longest
# response of its group, past the second-longest length 2).
OTB_ADV = [[1 - 4 / 3, 1 - 1.4, 1.0, 0.0], [2 - 4 / 3, 2 - 1.4, 0.0, 0.0], [3.0, 3.0, 0.0, 0.0]]
W_CONTIGUOUS = {(0, 0): 1.0, (0, 1): 0.5, (0, 2): 0.5, (1, 0): 0.5, (1, 1): 0.5, (2, 0): 1.0, (2, 1): 1.0}


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_optimal_token_baseline_by_hand(name):
    inputs = _otb_inputs([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]],
                         [[0, 0, 1, 0], [0, 2, 0, 0], [0, 3, 0, 0]], W_CONTIGUOUS)
    adv, ret = ADV_ESTIMATORS.get(name)(inputs, SimpleNamespace())
    torch.testing.assert_close(adv, torch.tensor(OTB_ADV, dtype=D), atol=1e-7, rtol=0)
    torch.testing.assert_close(ret, torch.tensor([[1, 1, 1, 0], [2, 2, 0, 0], [3, 3, 0, 0]], dtype=D))


def test_tir_aligns_by_generated_token_and_single_turn_by_column():
    # row 0 has a tool observation at column 1 (masked); its valid tokens are columns 0, 2, 3 with w = 1, .5, .5.
    mask = [[1, 0, 1, 1], [1, 1, 0, 0], [1, 1, 0, 0]]
    rewards = [[0, 0, 0, 1], [0, 2, 0, 0], [0, 3, 0, 0]]
    w = {(0, 0): 1.0, (0, 2): 0.5, (0, 3): 0.5, (1, 0): 0.5, (1, 1): 0.5, (2, 0): 1.0, (2, 1): 1.0}
    tir, _ = ADV_ESTIMATORS.get("tir_optimal_token_baseline")(_otb_inputs(mask, rewards, w), SimpleNamespace())
    # the k-th generated tokens line up: same numbers as the contiguous case, at columns 0, 2, 3
    torch.testing.assert_close(tir[0], torch.tensor([1 - 4 / 3, 0.0, 1 - 1.4, 1.0], dtype=D), atol=1e-7, rtol=0)
    torch.testing.assert_close(tir[1], torch.tensor(OTB_ADV[1], dtype=D), atol=1e-7, rtol=0)
    # by column: B_0 = 4/3 as before; column 1 has only row 1 (B = 2 * 1 / 1 = 2); row 0's columns >= 2 are
    # past row 1's length 2, so its baseline is 0 there
    single, _ = ADV_ESTIMATORS.get("optimal_token_baseline")(_otb_inputs(mask, rewards, w), SimpleNamespace())
    torch.testing.assert_close(single[0], torch.tensor([1 - 4 / 3, 0.0, 1.0, 1.0], dtype=D), atol=1e-7, rtol=0)
    torch.testing.assert_close(single[1], torch.tensor([2 - 4 / 3, 0.0, 0.0, 0.0], dtype=D), atol=1e-7, rtol=0)


def test_optimal_token_baseline_needs_sum_pi_squared():
    inputs = AdvantageInputs(torch.ones(2, 1), torch.ones(2, 1), index=np.array(["a", "a"], dtype=object))
    with pytest.raises(ConfigError, match="calculate_sum_pi_squared=true"):
        ADV_ESTIMATORS.get("optimal_token_baseline")(inputs, SimpleNamespace())


# ------------------------------------------------------------------------------------------ GDPO

def _gdpo(weights, components):
    inputs = AdvantageInputs(torch.zeros(4, 1, dtype=D), torch.ones(4, 1, dtype=D),
                             index=np.array(["a", "a", "b", "b"], dtype=object),
                             reward_components={k: torch.tensor(v, dtype=D) for k, v in components.items()})
    cfg = SimpleNamespace(norm_adv_by_std_in_grpo=True, gdpo_reward_weights=weights)
    return ADV_ESTIMATORS.get("gdpo")(inputs, cfg)


def test_gdpo_normalizes_each_component_then_whitens():
    # a group of two (x, y), x != y, GRPO-normalizes to -+ (|x-y|/2) / (|x-y|/sqrt 2) = -+ 1/sqrt 2 = -+ s
    # acc (1, 0 | 1, 1) -> (s, -s | 0, 0); fmt (0, 1 | 0, 2) -> (-s, s | -s, s)
    # weights (1, 2): sum = (-s, s, -2s, 2s); whitened: mean 0, unbiased var = 10 s^2 / 3 = 5/3
    adv, ret = _gdpo([1.0, 2.0], {"acc": [1, 0, 1, 1], "fmt": [0, 1, 0, 2]})
    s, sd = 1 / math.sqrt(2), math.sqrt(5 / 3)
    torch.testing.assert_close(adv[:, 0], torch.tensor([-s, s, -2 * s, 2 * s], dtype=D) / sd, atol=1e-5, rtol=0)
    assert torch.equal(adv, ret)
    # GRPO on the weighted sum (1, 2 | 1, 5) would give the same advantage to both groups instead
    assert abs(adv[2, 0].item()) > abs(adv[0, 0].item()) * 1.9


def test_gdpo_weights_must_match_components():
    with pytest.raises(ConfigError, match="gdpo_reward_weights has 1 entries for 2"):
        _gdpo([1.0], {"acc": [1, 0, 1, 1], "fmt": [0, 1, 0, 2]})

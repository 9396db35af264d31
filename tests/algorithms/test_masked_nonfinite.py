"""NaN and inf at masked positions stay out of every loss, KL, advantage and their gradients.

Masked positions are selected away (``torch.where``), not multiplied by 0 (``0 * nan = nan``).
Each case compares with the hand-computed value of the same data with zeros there.
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
    apply_kl_penalty,
    kl_loss,
    loss_agg_globals,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from rlforge.algorithms.kl import FixedKLController
from rlforge.config.actor import FlowRLConfig

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
D = torch.float64
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=D)  # last row fully masked
BAD = torch.tensor([[0, 0, math.nan], [0, math.inf, -math.inf], [math.nan, math.inf, -math.inf]], dtype=D)
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=D)
HAND = {  # valid tokens: row 0 -> 1, 2; row 1 -> 4 (see tests/algorithms/test_aggregation.py)
    "token-mean": 7 / 3, "token-sum": 7.0, "seq-mean-token-sum": 3.5, "seq-mean-token-mean": 2.75, "seq-mean-token-sum-norm": 7 / 6,
}


def _poisoned(x: torch.Tensor, mask: torch.Tensor = MASK) -> torch.Tensor:
    """``x`` with NaN / +inf / -inf at the masked positions."""
    return torch.where(mask.bool(), x, BAD)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_globals", [False, True])
def test_agg_loss_ignores_nonfinite_masked_values(mode, with_globals):
    glob = loss_agg_globals(MASK) if with_globals else {}
    x = _poisoned(LOSS).requires_grad_(True)
    loss = agg_loss(x, MASK, mode, **glob)
    assert loss.item() == pytest.approx(HAND[mode], abs=1e-12)
    loss.backward()
    assert torch.isfinite(x.grad).all()
    assert (x.grad[~MASK.bool()] == 0).all()
    clean = LOSS.clone().requires_grad_(True)
    agg_loss(clean, MASK, mode, **glob).backward()
    torch.testing.assert_close(x.grad, clean.grad, atol=0, rtol=0)


@pytest.mark.parametrize("mode", MODES)
def test_all_masked_is_a_finite_zero_with_a_finite_gradient(mode):
    mask = torch.zeros(2, 3, dtype=D)
    x = torch.full((2, 3), math.nan, dtype=D).requires_grad_(True)
    loss = agg_loss(x, mask, mode)
    assert loss.item() == 0.0 and torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(x.grad).all() and (x.grad == 0).all()


def test_masked_helpers_ignore_nonfinite_masked_values():
    x = _poisoned(LOSS)
    assert masked_sum(x, MASK).item() == 7.0
    torch.testing.assert_close(masked_sum(x, MASK, dim=-1), torch.tensor([3.0, 4.0, 0.0], dtype=D))
    assert masked_mean(x, MASK).item() == pytest.approx(7 / 3)
    torch.testing.assert_close(masked_mean(x, MASK, dim=-1), torch.tensor([1.5, 4.0, 0.0], dtype=D))
    # values 1, 2, 4: mean 7/3, unbiased variance ((4/3)^2 + (1/3)^2 + (5/3)^2) / 2 = 7/3
    assert masked_var(x, MASK).item() == pytest.approx(7 / 3)
    w = masked_whiten(x, MASK)[MASK.bool()]
    torch.testing.assert_close(w, (torch.tensor([1.0, 2.0, 4.0], dtype=D) - 7 / 3) / math.sqrt(7 / 3 + 1e-8))
    assert masked_mean(torch.full((2, 2), math.nan), torch.zeros(2, 2)).item() == 0.0


def _loss_cfg(mode):
    pl = SimpleNamespace(loss_mode=mode, clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0, kl_cov_ratio=0.0002,
                         ppo_kl_coef=0.1, flowrl=FlowRLConfig(beta=2.0), dro_beta=0.1)
    return SimpleNamespace(clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                           tau_pos=1.0, tau_neg=1.05, policy_loss=pl)


def _loss_run(name, poison):
    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]], dtype=D)
    old = -torch.rand(4, 4, generator=g, dtype=D) - 0.5
    logp = (old + 0.1 * torch.randn(4, 4, generator=g, dtype=D)).requires_grad_(True)
    adv = torch.randn(4, 4, generator=g, dtype=D)
    ref = old - 0.05
    rewards = torch.zeros(4, 4, dtype=D)
    rewards[:, 0] = torch.tensor([1.0, 0.0, 0.5, 2.0], dtype=D)
    if poison:  # -inf log-probs (padding), NaN advantages and rewards where the mask is 0
        off = ~mask.bool()
        old, ref = old.masked_fill(off, -math.inf), ref.masked_fill(off, -math.inf)
        adv, rewards = adv.masked_fill(off, math.nan), rewards.masked_fill(off, math.nan)
    inputs = PolicyLossInputs(old, logp, adv, mask, "token-mean", ref_log_prob=ref, token_level_rewards=rewards,
                              index=np.array(["a", "a", "b", "b"], dtype=object),
                              log_z=torch.tensor([0.1, -0.2, 0.3, 0.0], dtype=D),
                              generator=torch.Generator().manual_seed(1))
    out = POLICY_LOSSES.get(name)(inputs, _loss_cfg(name))
    out.loss.backward()
    return out.loss.detach(), logp.grad


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_policy_loss_ignores_nonfinite_masked_inputs(name):
    loss, grad = _loss_run(name, poison=True)
    ref_loss, ref_grad = _loss_run(name, poison=False)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    torch.testing.assert_close(loss, ref_loss, atol=1e-12, rtol=0)
    torch.testing.assert_close(grad, ref_grad, atol=1e-12, rtol=0)


def test_kl_loss_and_kl_penalty_ignore_nonfinite_masked_log_probs():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=D)
    ref = torch.tensor([[-1.5, -1.0, 0.0], [-0.5, 0.0, 0.0], [0.0, 0.0, 0.0]], dtype=D)
    x = logp.clone().requires_grad_(True)
    loss = kl_loss(x, _poisoned(ref), MASK, "kl", "token-mean")  # k1 = logp - ref: 0.5, -1, 0
    assert loss.item() == pytest.approx(-0.5 / 3)
    loss.backward()
    torch.testing.assert_close(x.grad, MASK / 3)
    scores = torch.zeros(3, 3, dtype=D)
    rewards, metrics = apply_kl_penalty(scores, _poisoned(logp), ref, MASK, FixedKLController(0.1), "kl")
    torch.testing.assert_close(rewards, -0.1 * torch.tensor([[0.5, -1.0, 0], [0, 0, 0], [0, 0, 0]], dtype=D))
    assert metrics["actor/reward_kl_penalty"] == pytest.approx((-0.25 + 0.0 + 0.0) / 3)


def _adv_cfg(name):
    return SimpleNamespace(adv_estimator=name, gamma=0.9, lam=0.8, norm_adv_by_std_in_grpo=True)


def _adv_run(name, poison):
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 1]], dtype=D)
    rewards = torch.zeros(4, 4, dtype=D)
    rewards[[0, 1, 2, 3], [2, 1, 2, 3]] = torch.tensor([1.0, 0.0, 0.5, 2.0], dtype=D)
    values = torch.linspace(-1, 1, 16, dtype=D).reshape(4, 4)
    old = -torch.linspace(0.1, 2.0, 16, dtype=D).reshape(4, 4)
    spp = torch.linspace(0.2, 0.9, 16, dtype=D).reshape(4, 4)
    if poison:
        off = ~mask.bool()
        rewards, values = rewards.masked_fill(off, math.nan), values.masked_fill(off, math.inf)
        old, spp = old.masked_fill(off, -math.inf), spp.masked_fill(off, math.nan)
    inputs = AdvantageInputs(rewards, mask, index=np.array(["a", "a", "b", "b"], dtype=object), values=values,
                             reward_baselines=torch.tensor([0.5, 0.5, 1.0, 1.0], dtype=D),
                             old_log_probs=old, sum_pi_squared=spp)
    return ADV_ESTIMATORS.get(name)(inputs, _adv_cfg(name))


@pytest.mark.parametrize("name", ADV_ESTIMATORS.names())
def test_every_advantage_estimator_ignores_nonfinite_masked_inputs(name):
    adv, ret = _adv_run(name, poison=True)
    ref_adv, ref_ret = _adv_run(name, poison=False)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    torch.testing.assert_close(adv, ref_adv, atol=1e-12, rtol=0)
    torch.testing.assert_close(ret, ref_ret, atol=1e-12, rtol=0)

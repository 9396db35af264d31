import math
from types import SimpleNamespace

import pytest
import torch

from rlforge.algorithms import POLICY_LOSSES, PolicyLossInputs, compute_policy_loss, loss_agg_globals
from rlforge.errors import ConfigError


def _cfg(clip=0.2, low=None, high=None, c=3.0, mode="vanilla"):
    return SimpleNamespace(
        clip_ratio=clip, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c,
        policy_loss=SimpleNamespace(loss_mode=mode),
    )


def _hand_inputs():
    ratios = torch.tensor([[0.5, 1.0, 1.5], [0.5, 1.0, 1.5], [5.0, 1e9, 1e-9]])
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 1], [1, 0, 0]])  # row 2: padding with absurd ratios
    old = torch.full((3, 3), -1.0)
    log_prob = (old + ratios.log()).requires_grad_(True)
    return PolicyLossInputs(old_log_prob=old, log_prob=log_prob, advantages=advantages, response_mask=mask)


def test_vanilla_hand_case():
    inputs = _hand_inputs()
    out = compute_policy_loss(inputs, _cfg())
    # per-token losses: A=+1: -0.5, -1, -1.2 (clipped); A=-1: 0.8 (clipped), 1, 1.5; dual clip: min(5, 3) = 3
    assert out.loss.item() == pytest.approx((-0.5 - 1 - 1.2 + 0.8 + 1 + 1.5 + 3) / 7, abs=1e-6)
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 7)
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(1 / 7)
    ppo_kl = -(2 * math.log(0.5) + 2 * math.log(1.5) + math.log(5.0)) / 7
    assert out.metrics["ppo_kl"] == pytest.approx(ppo_kl, abs=1e-6)

    out.loss.backward()
    grad = inputs.log_prob.grad
    # d/dlogp of -A*r is -A*r; clipped and dual-clipped tokens and padding get no gradient.
    expected = torch.tensor([[-0.5, -1.0, 0.0], [0.0, 1.0, 1.5], [0.0, 0.0, 0.0]]) / 7
    torch.testing.assert_close(grad, expected, atol=1e-6, rtol=0)


def test_asymmetric_clip_high():
    out = compute_policy_loss(_hand_inputs(), _cfg(low=0.2, high=0.28))
    assert out.loss.item() == pytest.approx((-0.5 - 1 - 1.28 + 0.8 + 1 + 1.5 + 3) / 7, abs=1e-6)


def test_clip_ratio_c_must_exceed_one():
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.clip_ratio_c"):
        compute_policy_loss(_hand_inputs(), _cfg(c=1.0))


def test_unknown_loss_mode_names_key():
    with pytest.raises(ConfigError, match="policy_loss.loss_mode"):
        compute_policy_loss(_hand_inputs(), _cfg(mode="vanila"))
    assert "vanilla" in POLICY_LOSSES


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_policy_loss_micro_batch_invariance(agg):
    g = torch.Generator().manual_seed(1)
    b, r = 6, 5
    old = -torch.rand(b, r, generator=g, dtype=torch.float64) * 3
    new = old + 0.4 * torch.randn(b, r, generator=g, dtype=torch.float64)
    adv = torch.randn(b, r, generator=g, dtype=torch.float64)
    mask = (torch.arange(r)[None, :] < torch.tensor([5, 2, 4, 1, 3, 5])[:, None]).double()

    full_lp = new.clone().requires_grad_(True)
    full = compute_policy_loss(PolicyLossInputs(old, full_lp, adv, mask, agg), _cfg()).loss
    full.backward()

    lp = new.clone().requires_grad_(True)
    glob = loss_agg_globals(mask)
    total = 0.0
    for sl in (slice(0, 2), slice(2, 3), slice(3, 6)):
        part = compute_policy_loss(PolicyLossInputs(old[sl], lp[sl], adv[sl], mask[sl], agg, **glob), _cfg()).loss
        part.backward()
        total += part.item()
    assert total == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(lp.grad, full_lp.grad, atol=1e-12, rtol=0)

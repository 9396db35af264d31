"""Hand-computed cases for gspo, sapo, gpg, geo_mean, cispo, clip_cov, kl_cov."""

import math
from types import SimpleNamespace

import pytest
import torch

from rlforge.algorithms import POLICY_LOSSES, PolicyLossInputs, compute_policy_loss, loss_agg_globals
from rlforge.errors import ConfigError

LOG = math.log


def _cfg(mode, clip=0.2, tau_pos=1.0, tau_neg=1.05, **pl):
    policy_loss = dict(loss_mode=mode, clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0,
                       kl_cov_ratio=0.0002, ppo_kl_coef=0.1)
    policy_loss.update(pl)
    return SimpleNamespace(clip_ratio=clip, clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0,
                           tau_pos=tau_pos, tau_neg=tau_neg, policy_loss=SimpleNamespace(**policy_loss))


def _inputs(log_ratio, adv, mask, old=-1.0, agg="token-mean", **kw):
    old_t = torch.full_like(torch.as_tensor(log_ratio, dtype=torch.float64), old) if isinstance(old, float) else old
    lp = (old_t + torch.as_tensor(log_ratio, dtype=torch.float64)).requires_grad_(True)
    return PolicyLossInputs(old_t, lp, torch.as_tensor(adv, dtype=torch.float64),
                            torch.as_tensor(mask, dtype=torch.float64), agg, **kw)


def test_all_losses_registered():
    assert set(POLICY_LOSSES.names()) == {
        "vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "geo_mean", "cispo", "flowrl",
        "dppo_tv", "dppo_kl", "dro",
    }


def test_gspo_sequence_ratio_and_forced_seq_mean_token_mean():
    inp = _inputs([[LOG(1.1), 0.0], [LOG(0.5), 9.0]], [[1.0, 1.0], [-1.0, -1.0]], [[1, 1], [1, 0]])
    out = compute_policy_loss(inp, _cfg("gspo"))
    s0 = math.sqrt(1.1)  # exp(mean(log 1.1, 0)), inside [0.8, 1.2]
    # row 1: s = 0.5 (padding ignored), A < 0 -> clipped branch -A * 0.8 = 0.8.  seq-mean-token-mean
    # although loss_agg_mode is token-mean: ((-s0 - s0) / 2 + 0.8) / 2
    assert out.loss.item() == pytest.approx((-s0 + 0.8) / 2, abs=1e-9)
    out.loss.backward()
    # d/dlogp_t of -A * s_{i,t} is -A * s_i; times 1/2 (token mean) * 1/2 (seq mean); row 1 clipped
    expected = torch.tensor([[-s0 / 4, -s0 / 4], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(inp.log_prob.grad, expected, atol=1e-9, rtol=0)
    assert out.metrics["pg_clipfrac"] == pytest.approx(1 / 3)
    assert out.metrics["ppo_kl"] == pytest.approx(-(LOG(1.1) + LOG(0.5)) / 3)


def test_sapo_soft_gate():
    inp = _inputs([[0.0], [LOG(2.0)], [LOG(3.0)]], [[1.0], [-1.0], [0.0]], [[1], [1], [1]])
    out = compute_policy_loss(inp, _cfg("sapo", tau_pos=1.0, tau_neg=1.05))
    sig = 1 / (1 + math.exp(-1.05 * (2.0 - 1.0)))
    gate_neg = sig * 4 / 1.05
    # row 0: gate(1) = sigmoid(0) * 4 = 2 -> -2; row 1: +gate_neg; row 2: A = 0 -> 0.  Mean over 3 seqs.
    assert out.loss.item() == pytest.approx((-2.0 + gate_neg) / 3, abs=1e-9)
    out.loss.backward()
    # dL/dlogp = -A * gate'(r) * r with gate'(r) = 4 * sig * (1 - sig); gate'(1) = 1
    expected = torch.tensor([[-1.0], [4 * sig * (1 - sig) * 2.0], [0.0]], dtype=torch.float64) / 3
    torch.testing.assert_close(inp.log_prob.grad, expected, atol=1e-9, rtol=0)
    with pytest.raises(ConfigError, match="tau_pos"):
        compute_policy_loss(inp, _cfg("sapo", tau_neg=0.0))


def test_gpg_is_plain_reinforce():
    inp = _inputs([[0.5, 0.0]], [[2.0, 2.0]], [[1, 0]], old=-1.0)
    out = compute_policy_loss(inp, _cfg("gpg"))
    assert out.loss.item() == pytest.approx(0.5 * 2.0)  # -logp * A with logp = -1 + 0.5 = -0.5
    out.loss.backward()
    torch.testing.assert_close(inp.log_prob.grad, torch.tensor([[-2.0, 0.0]], dtype=torch.float64))


def test_geo_mean_log_space_clip():
    inp = _inputs([[0.3, -0.1], [-0.5, 0.4], [5.0, 5.0]], [[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]],
                  [[1, 1], [1, 1], [0, 0]])
    out = compute_policy_loss(inp, _cfg("geo_mean"))
    # row 0 (A>0): upper clip 0.3 -> 0.2, mean 0.05; row 1 (A<0): lower clip -0.5 -> -0.2, mean 0.1;
    # row 2 fully masked: not counted
    assert out.loss.item() == pytest.approx((-math.exp(0.05) + math.exp(0.1)) / 2, abs=1e-9)
    out.loss.backward()
    expected = torch.tensor([[0.0, -math.exp(0.05) / 4], [0.0, math.exp(0.1) / 4], [0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(inp.log_prob.grad, expected, atol=1e-9, rtol=0)
    assert out.metrics["pg_clipfrac"] == pytest.approx(1 / 4)
    assert out.metrics["pg_clipfrac_lower"] == pytest.approx(2 / 4)  # verl counts 0.4 > 0.2 too


def test_cispo_detached_clipped_weight():
    inp = _inputs([[LOG(1.5), LOG(0.5), 0.0]], [[1.0, -1.0, 2.0]], [[1, 1, 1]], old=-1.0)
    out = compute_policy_loss(inp, _cfg("cispo"))
    lp = [-1 + LOG(1.5), -1 + LOG(0.5), -1.0]
    expected = (-1.2 * 1.0 * lp[0] - 0.8 * -1.0 * lp[1] - 1.0 * 2.0 * lp[2]) / 3
    assert out.loss.item() == pytest.approx(expected, abs=1e-9)
    out.loss.backward()
    # every token keeps a gradient -w * A / 3, even the clipped ones
    torch.testing.assert_close(inp.log_prob.grad, torch.tensor([[-1.2, 0.8, -2.0]], dtype=torch.float64) / 3)
    assert out.metrics["pg_clipfrac"] == pytest.approx(2 / 3)


def _cov_case():
    # A mean 0 -> A - mean = A; log_prob mean -2 -> deviations [[1, -1], [1, -1]]; cov [[2, -2], [-2, 2]].
    log_prob = torch.tensor([[-1.0, -3.0], [-1.0, -3.0]], dtype=torch.float64)
    log_ratio = torch.tensor([[LOG(2.0), 0.0], [0.0, 0.0]], dtype=torch.float64)  # token (0,0) is PPO-clipped
    adv = torch.tensor([[2.0, 2.0], [-2.0, -2.0]], dtype=torch.float64)
    return log_prob - log_ratio, log_ratio, adv


def test_clip_cov_drops_in_band_unclipped_tokens():
    old, log_ratio, adv = _cov_case()
    inp = _inputs(log_ratio, adv, torch.ones(2, 2), old=old)
    out = compute_policy_loss(inp, _cfg("clip_cov", clip_cov_ratio=0.5))
    # candidates: cov in (1, 5) and not PPO-clipped -> only (1, 1); it is zeroed.
    # per token: (0,0) clipped -2 * 1.2; (0,1) -2; (1,0) +2; (1,1) dropped
    assert out.loss.item() == pytest.approx((-2.4 - 2.0 + 2.0) / 4, abs=1e-9)
    out.loss.backward()
    torch.testing.assert_close(inp.log_prob.grad, torch.tensor([[0.0, -0.5], [0.5, 0.0]], dtype=torch.float64))
    assert out.metrics["pg_clipfrac"] == pytest.approx(1 / 4)
    out = compute_policy_loss(_inputs(log_ratio, adv, torch.ones(2, 2), old=old), _cfg("clip_cov", clip_cov_ub=1.5))
    assert out.metrics["pg_clipfrac"] == 0.0  # no candidate: cov 2 is not < 1.5
    with pytest.raises(ConfigError, match="clip_cov_ratio"):
        compute_policy_loss(inp, _cfg("clip_cov", clip_cov_ratio=0.0))


def test_clip_cov_random_pick_uses_generator():
    log_prob = torch.tensor([[-1.0, -3.0, -1.0, -3.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0, -2.0, 2.0, -2.0]], dtype=torch.float64)  # cov 2 at every token
    picks = []
    for seed in (0, 0, 1, 2, 3, 4, 5):
        inp = _inputs(torch.zeros(1, 4), adv, torch.ones(1, 4), old=log_prob,
                      generator=torch.Generator().manual_seed(seed))
        out = compute_policy_loss(inp, _cfg("clip_cov", clip_cov_ratio=0.25))  # exactly one token
        out.loss.backward()
        zeroed = (inp.log_prob.grad == 0).nonzero()[:, 1].tolist()
        assert len(zeroed) == 1 and out.metrics["pg_clipfrac"] == 0.25
        picks.append(zeroed[0])
    assert picks[0] == picks[1]  # same seed, same pick
    assert len(set(picks)) > 1  # the pick is random


def test_kl_cov_penalises_top_covariance():
    log_prob = torch.tensor([[-1.0, -3.0], [-1.5, -2.5]], dtype=torch.float64)
    log_ratio = torch.tensor([[0.1, 0.0], [0.0, 0.0]], dtype=torch.float64)
    adv = torch.tensor([[2.0, 2.0], [-2.0, -2.0]], dtype=torch.float64)
    # cov = A * (log_prob + 2) = [[2, -2], [-1, 1]]: top-1 is (0, 0)
    inp = _inputs(log_ratio, adv, torch.ones(2, 2), old=log_prob - log_ratio)
    out = compute_policy_loss(inp, _cfg("kl_cov", kl_cov_ratio=0.25, ppo_kl_coef=0.5))
    expected = (-2 * math.exp(0.1) + 0.5 * 0.1 - 2.0 + 2.0 + 2.0) / 4
    assert out.loss.item() == pytest.approx(expected, abs=1e-9)
    out.loss.backward()
    grad00 = (-2 * math.exp(0.1) + 0.5) / 4
    torch.testing.assert_close(inp.log_prob.grad, torch.tensor([[grad00, -0.5], [0.5, 0.5]], dtype=torch.float64))
    assert out.metrics["ppo_kl"] == pytest.approx(0.1 / 4)
    assert out.metrics["pg_clipfrac"] == pytest.approx(1 / 4)
    with pytest.raises(ConfigError, match="kl_cov_ratio"):
        compute_policy_loss(inp, _cfg("kl_cov", kl_cov_ratio=0.0))


@pytest.mark.parametrize("mode", ["gspo", "sapo", "gpg", "geo_mean", "cispo"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_micro_batch_invariance(mode, agg):
    g = torch.Generator().manual_seed(3)
    b, r = 6, 5
    old = -torch.rand(b, r, generator=g, dtype=torch.float64) * 3
    new = old + 0.3 * torch.randn(b, r, generator=g, dtype=torch.float64)
    adv = torch.randn(b, 1, generator=g, dtype=torch.float64).expand(b, r).contiguous()
    mask = (torch.arange(r)[None, :] < torch.tensor([5, 2, 4, 0, 3, 5])[:, None]).double()
    cfg = _cfg(mode)

    full_lp = new.clone().requires_grad_(True)
    full = compute_policy_loss(PolicyLossInputs(old, full_lp, adv, mask, agg), cfg).loss
    full.backward()
    lp = new.clone().requires_grad_(True)
    glob = loss_agg_globals(mask)
    total = 0.0
    for sl in (slice(0, 2), slice(2, 3), slice(3, 6)):
        part = compute_policy_loss(PolicyLossInputs(old[sl], lp[sl], adv[sl], mask[sl], agg, **glob), cfg).loss
        part.backward()
        total += part.item()
    assert total == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(lp.grad, full_lp.grad, atol=1e-12, rtol=0)

import math
from types import SimpleNamespace

import pytest
import torch

from rlforge.algorithms import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    build_kl_controller,
    kl_loss,
    kl_penalty,
)
from rlforge.errors import ConfigError

LOGP = torch.log(torch.tensor([[0.5, 0.25]]))
REF = torch.log(torch.tensor([[0.25, 0.5]]))
L2 = math.log(2.0)

EXPECTED = {
    "kl": [L2, -L2],
    "abs": [L2, L2],
    "mse": [0.5 * L2**2, 0.5 * L2**2],
    "low_var_kl": [0.5 + L2 - 1, 2 - L2 - 1],  # r - log r - 1 with r = ref/p = 0.5, 2
}
ALIASES = {"k1": "kl", "k2": "mse", "k3": "low_var_kl"}


@pytest.mark.parametrize("name", [*EXPECTED, *ALIASES])
def test_estimator_values(name):
    expected = EXPECTED[ALIASES.get(name, name)]
    torch.testing.assert_close(kl_penalty(LOGP, REF, name)[0], torch.tensor(expected), atol=1e-6, rtol=0)
    # "+" variant: same value
    torch.testing.assert_close(kl_penalty(LOGP, REF, name + "+")[0], torch.tensor(expected), atol=1e-6, rtol=0)


def test_k3_is_clamped():
    out = kl_penalty(torch.tensor([[0.0]]), torch.tensor([[50.0]]), "k3")
    assert out.item() == 10.0


@pytest.mark.parametrize("name", ["kl+", "k1+", "abs+", "k3+", "low_var_kl+", "k2+"])
def test_straight_through_gradient_is_k2(name):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(3, 4, generator=g)
    ref = torch.randn(3, 4, generator=g)
    lp_plus = base.clone().requires_grad_(True)
    kl_penalty(lp_plus, ref, name).sum().backward()
    lp_k2 = base.clone().requires_grad_(True)
    kl_penalty(lp_k2, ref, "k2").sum().backward()
    torch.testing.assert_close(lp_plus.grad, lp_k2.grad)
    torch.testing.assert_close(lp_plus.grad, base - ref)  # d/dx 0.5 (x - ref)^2
    lp_plain = base.clone().requires_grad_(True)
    kl_penalty(lp_plain, ref, "k1").sum().backward()
    assert not torch.allclose(lp_plain.grad, lp_plus.grad)


def test_unknown_estimator():
    with pytest.raises(ConfigError, match="low_var_kl"):
        kl_penalty(LOGP, REF, "low_var")
    assert "full" not in KL_ESTIMATORS


def test_kl_loss_aggregates():
    mask = torch.tensor([[1.0, 0.0]])
    assert kl_loss(LOGP, REF, mask, "k1", "token-mean").item() == pytest.approx(L2, abs=1e-6)
    full = kl_loss(LOGP, REF, torch.ones(1, 2), "abs", "seq-mean-token-sum").item()
    assert full == pytest.approx(2 * L2, abs=1e-6)
    assert kl_loss(LOGP, REF, torch.ones(1, 2), "abs", "token-mean", global_num_tokens=4).item() == pytest.approx(
        L2 / 2, abs=1e-6
    )


def test_adaptive_controller_formula_and_state():
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=6.0, horizon=10000)
    ctrl.update(current_kl=9.0, n_steps=256)  # error 0.5 -> clipped to 0.2
    assert ctrl.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000))
    v = ctrl.value
    ctrl.update(current_kl=5.4, n_steps=100)  # error -0.1
    assert ctrl.value == pytest.approx(v * (1 - 0.1 * 100 / 10000))
    other = AdaptiveKLController(0.5, 6.0, 10000)
    other.load_state_dict(ctrl.state_dict())
    assert other.value == ctrl.value


def test_build_controller():
    fixed = build_kl_controller(SimpleNamespace(type="fixed", kl_coef=0.3, horizon=1, target_kl=1))
    assert isinstance(fixed, FixedKLController)
    fixed.update(current_kl=100.0, n_steps=10)
    assert fixed.value == 0.3
    adaptive = build_kl_controller(SimpleNamespace(type="adaptive", kl_coef=0.2, horizon=100, target_kl=0.5))
    assert isinstance(adaptive, AdaptiveKLController) and adaptive.target == 0.5
    with pytest.raises(ConfigError, match="algorithm.kl_ctrl.type"):
        build_kl_controller(SimpleNamespace(type="adaptiv", kl_coef=0.2, horizon=100, target_kl=0.5))


def test_apply_kl_penalty():
    scores = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -2.0, -3.0]])
    ref = torch.tensor([[-1.5, -0.5, -9.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    ctrl = AdaptiveKLController(init_kl_coef=0.5, target_kl=0.1, horizon=100)
    rewards, metrics = apply_kl_penalty(scores, old, ref, mask, ctrl, kl_penalty="kl")
    # k1 = old - ref, masked: [[0.5, -0.5, 0], [0, -1, -2]]
    expected = scores - 0.5 * torch.tensor([[0.5, -0.5, 0.0], [0.0, -1.0, -2.0]])
    torch.testing.assert_close(rewards, expected)
    current_kl = (0.0 + (-3.0 / 3)) / 2  # mean over sequences of per-sequence masked means
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(current_kl)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5  # coefficient used, before the update
    assert ctrl.value == pytest.approx(0.5 * (1 - 0.2 * 2 / 100))

import math
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rlforge.algorithms import ADV_ESTIMATORS, AdvantageInputs, compute_advantage
from rlforge.errors import ConfigError


def _grpo_cfg(norm=True):
    return SimpleNamespace(adv_estimator="grpo", norm_adv_by_std_in_grpo=norm, gamma=1.0, lam=1.0)


def _grpo_batch():
    # group "a": scores [1, 0, 0, 1]; group "b": one response, score 2; group "c": scores [1, 1]
    mask = torch.tensor(
        [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.float32
    )
    rewards = torch.zeros(7, 3)
    scores = [1.0, 0.0, 0.0, 1.0, 2.0, 1.0, 1.0]
    for i, s in enumerate(scores):
        last = int(mask[i].sum()) - 1
        rewards[i, last] = s
    index = np.array(["a", "a", "a", "a", "b", "c", "c"], dtype=object)
    return AdvantageInputs(token_level_rewards=rewards, response_mask=mask, index=index)


def test_grpo_hand_case_normalized():
    inputs = _grpo_batch()
    adv, ret = compute_advantage(inputs, _grpo_cfg(norm=True))
    std_a = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1] (= torch.std)
    assert std_a == pytest.approx(torch.tensor([1.0, 0, 0, 1]).std().item())
    expected = [0.5 / (std_a + 1e-6), -0.5 / (std_a + 1e-6), -0.5 / (std_a + 1e-6), 0.5 / (std_a + 1e-6),
                2.0 / (1.0 + 1e-6),  # size-1 group: mean 0, std 1 (verl)
                0.0, 0.0]  # equal scores: zero advantage
    for i, e in enumerate(expected):
        valid = inputs.response_mask[i].bool()
        torch.testing.assert_close(adv[i][valid], torch.full((int(valid.sum()),), e), atol=1e-6, rtol=0)
        assert (adv[i][~valid] == 0).all()
    assert abs(expected[0]) == pytest.approx(0.8660, abs=1e-4)
    torch.testing.assert_close(ret, adv)


def test_grpo_without_std_normalisation():
    inputs = _grpo_batch()
    adv, _ = compute_advantage(inputs, _grpo_cfg(norm=False))
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5, 2.0, 0.0, 0.0]))
    assert adv[2, 1] == 0 and adv[1, 2] == 0


def test_grpo_needs_index():
    inputs = AdvantageInputs(token_level_rewards=torch.zeros(2, 2), response_mask=torch.ones(2, 2))
    with pytest.raises(ConfigError):
        compute_advantage(inputs, _grpo_cfg())


def test_unknown_estimator():
    with pytest.raises(ConfigError, match="algorithm.adv_estimator"):
        compute_advantage(_grpo_batch(), SimpleNamespace(adv_estimator="grpoo"))


def test_shape_validation():
    with pytest.raises(ValueError):
        AdvantageInputs(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 2))


def _gae_cfg(gamma, lam):
    return SimpleNamespace(adv_estimator="gae", gamma=gamma, lam=lam)


def test_gae_hand_case_three_tokens():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.4, 0.3]])
    mask = torch.ones(1, 3)
    adv, ret = compute_advantage(AdvantageInputs(rewards, mask, values=values), _gae_cfg(0.9, 0.8))
    # deltas: 1 - 0.3 = 0.7; 0.9*0.3 - 0.4 = -0.13; 0.9*0.4 - 0.5 = -0.14; gamma*lam = 0.72
    raw = [-0.14 + 0.72 * (-0.13 + 0.72 * 0.7), -0.13 + 0.72 * 0.7, 0.7]
    assert raw == pytest.approx([0.12928, 0.374, 0.7])
    torch.testing.assert_close(ret[0], torch.tensor([0.62928, 0.774, 1.0]), atol=1e-6, rtol=0)
    mu, sd = statistics.mean(raw), statistics.stdev(raw)  # unbiased, as masked_whiten
    expected = [(a - mu) / math.sqrt(sd**2 + 1e-8) for a in raw]
    torch.testing.assert_close(adv[0], torch.tensor(expected), atol=1e-5, rtol=0)


def _gae_loop_reference(rewards, values, mask, gamma, lam):
    """Plain-Python GAE over the valid tokens of each row only (masked tokens skipped)."""
    out = [[0.0] * len(rewards[0]) for _ in rewards]
    for i in range(len(rewards)):
        pos = [t for t in range(len(rewards[i])) if mask[i][t] > 0]
        next_v, next_a = 0.0, 0.0
        for t in reversed(pos):
            delta = rewards[i][t] + gamma * next_v - values[i][t]
            next_a = delta + gamma * lam * next_a
            next_v = values[i][t]
            out[i][t] = next_a
    return out


def test_gae_matches_loop_reference_with_padding_and_holes():
    g = torch.Generator().manual_seed(0)
    b, r = 5, 8
    rewards = torch.randn(b, r, generator=g, dtype=torch.float64)
    values = torch.randn(b, r, generator=g, dtype=torch.float64)
    lengths = torch.tensor([8, 5, 3, 7, 1])
    mask = (torch.arange(r)[None, :] < lengths[:, None]).double()
    mask[0, 2:4] = 0  # observation tokens inside a response
    mask[3, 1] = 0
    gamma, lam = 0.97, 0.9
    adv, ret = ADV_ESTIMATORS.get("gae")(AdvantageInputs(rewards, mask, values=values), _gae_cfg(gamma, lam))

    ref = _gae_loop_reference(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    valid = mask.bool()
    ref_raw = torch.tensor(ref, dtype=torch.float64)
    torch.testing.assert_close(ret[valid], (ref_raw + values)[valid], atol=1e-10, rtol=0)
    flat = ref_raw[valid].tolist()
    mu, sd = statistics.mean(flat), statistics.stdev(flat)
    torch.testing.assert_close(adv[valid], (ref_raw[valid] - mu) / math.sqrt(sd**2 + 1e-8), atol=1e-8, rtol=0)
    assert (adv[~valid] == 0).all() and (ret[~valid] == 0).all()


def test_gae_needs_values():
    with pytest.raises(ConfigError):
        compute_advantage(AdvantageInputs(torch.zeros(1, 2), torch.ones(1, 2)), _gae_cfg(1.0, 1.0))

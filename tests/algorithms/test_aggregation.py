import pytest
import torch

from rlforge.algorithms import agg_loss, loss_agg_globals, masked_mean, masked_var, masked_whiten
from rlforge.errors import ConfigError

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]], dtype=torch.float64)  # last row fully masked


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("token-sum", 7.0),  # 1 + 2 + 4
        ("seq-mean-token-sum", 3.5),  # (3 + 4) / 2 seqs
        ("seq-mean-token-mean", 2.75),  # (1.5 + 4) / 2 seqs
        ("seq-mean-token-sum-norm", 7 / 6),  # (3/3 + 4/3) / 2 seqs, horizon = R = 3
    ],
)
def test_agg_modes_hand_case(mode, expected):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected, abs=1e-12)


def test_sum_norm_custom_horizon():
    assert agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", horizon=4).item() == pytest.approx(0.875)


def test_unknown_mode_names_key_and_valid_modes():
    with pytest.raises(ConfigError) as err:
        agg_loss(LOSS, MASK, "token-max")
    msg = str(err.value)
    assert "actor_rollout_ref.actor.loss_agg_mode" in msg
    for mode in MODES:
        assert mode in msg


def _random_batch(seed, b=7, r=6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, r + 1, (b,), generator=g)
    lengths[0] = r
    mask = (torch.arange(r)[None, :] < lengths[:, None]).double()
    mask[1, 1] = 0.0  # a hole in the middle (observation token)
    x = torch.randn(b, r, dtype=torch.float64, generator=g)
    w = torch.randn(b, r, dtype=torch.float64, generator=g)
    return x, w, mask


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("splits", [[4, 3], [2, 2, 3], [1, 5, 1]])
def test_micro_batch_invariance_loss_and_grad(mode, splits):
    x, w, mask = _random_batch(seed=len(splits) * 10 + len(mode))

    full_param = x.clone().requires_grad_(True)
    full = agg_loss(full_param.square() * w, mask, mode)
    full.backward()

    micro_param = x.clone().requires_grad_(True)
    glob = loss_agg_globals(mask)
    total = torch.zeros((), dtype=torch.float64)
    start = 0
    for size in splits:
        sl = slice(start, start + size)
        part = agg_loss(micro_param[sl].square() * w[sl], mask[sl], mode, **glob)
        part.backward()  # gradients accumulate across micro-batches
        total = total + part.detach()
        start += size

    assert total.item() == pytest.approx(full.item(), abs=1e-12)
    torch.testing.assert_close(micro_param.grad, full_param.grad, atol=1e-12, rtol=0)


def test_without_globals_micro_means_differ():
    # Guard that the invariance test above can fail: plain per-micro-batch means do not add up.
    x, w, mask = _random_batch(seed=3)
    loss = x.square() * w
    full = agg_loss(loss, mask, "token-mean")
    halves = agg_loss(loss[:4], mask[:4], "token-mean") + agg_loss(loss[4:], mask[4:], "token-mean")
    assert abs(halves.item() - full.item()) > 1e-3


def test_globals_count_only_sequences_with_tokens():
    assert loss_agg_globals(MASK) == {"global_num_tokens": 3.0, "global_num_seqs": 2.0}


def test_masked_helpers():
    v = torch.tensor([[1.0, 2.0, 100.0], [3.0, 4.0, -50.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    assert masked_mean(v, m).item() == pytest.approx(2.5)
    torch.testing.assert_close(masked_mean(v, m, dim=-1), torch.tensor([1.5, 3.5]))
    assert masked_var(v, m).item() == pytest.approx(5 / 3)  # unbiased var of 1,2,3,4
    assert masked_var(v, m, unbiased=False).item() == pytest.approx(1.25)
    w = masked_whiten(v, m)
    assert masked_mean(w, m).item() == pytest.approx(0.0, abs=1e-6)
    assert masked_var(w, m).item() == pytest.approx(1.0, abs=1e-5)
    assert masked_mean(v, torch.zeros_like(m)).item() == 0.0
    with pytest.raises(ValueError):
        masked_var(v, torch.tensor([[1.0, 0, 0], [0, 0, 0]]))

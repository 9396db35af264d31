import math

import pytest
import torch

from rlforge.algorithms import compute_value_loss, entropy_from_logits


def test_value_loss_clipping_hand_case():
    vpreds = torch.tensor([[1.0, 2.0, 0.5, 9.0]], requires_grad=True)
    values = torch.tensor([[0.5, 2.0, 0.0, 0.0]])
    returns = torch.tensor([[0.0, 3.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, cliprange_value=0.2)
    # token 0: clip(1.0)=0.7 -> max(1, 0.49) = 1; token 1: 1; token 2: clip(0.5)=0.2 -> max(0.25, 0.64) = 0.64
    assert loss.item() == pytest.approx(0.5 * (1 + 1 + 0.64) / 3, abs=1e-6)
    assert clipfrac == pytest.approx(1 / 3)
    loss.backward()
    # d/dv 0.5*(v-R)^2/3 on unclipped tokens; the clipped branch of token 2 has no gradient
    torch.testing.assert_close(vpreds.grad, torch.tensor([[1 / 3, -1 / 3, 0.0, 0.0]]), atol=1e-6, rtol=0)


def test_value_loss_seq_mode_and_globals():
    vpreds = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    zeros = torch.zeros(2, 2)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, _ = compute_value_loss(vpreds, zeros, vpreds, mask, 0.5, "seq-mean-token-sum")
    assert loss.item() == pytest.approx(0.5 * (2 + 4) / 2)
    part, _ = compute_value_loss(vpreds[:1], zeros[:1], vpreds[:1], mask[:1], 0.5, "seq-mean-token-sum",
                                 global_num_seqs=2)
    assert part.item() == pytest.approx(0.5 * 2 / 2)


def test_entropy_matches_direct_computation():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 11, generator=g, dtype=torch.float64) * 3
    p = torch.softmax(logits, dim=-1)
    direct = -(p * p.log()).sum(-1)
    out = entropy_from_logits(logits)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    torch.testing.assert_close(out, direct.float(), atol=1e-5, rtol=0)


def test_entropy_stable_and_float32():
    uniform = torch.zeros(1, 1, 50, dtype=torch.bfloat16)
    assert entropy_from_logits(uniform).item() == pytest.approx(math.log(50), abs=1e-5)
    peaked = torch.tensor([[[1e4, 0.0, -1e4]]])
    out = entropy_from_logits(peaked)
    assert torch.isfinite(out).all() and out.item() == pytest.approx(0.0, abs=1e-6)

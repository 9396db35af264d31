"""The two-kernel Triton sampler (rlforge/rollout/native/triton_sampler.py) against softmax:
greedy picks, log-probs, the distribution of draws (chi-square), masked tokens, bad rows.

Runs on CUDA, or on CPU under Triton's interpreter (``TRITON_INTERPRET=1 pytest ...``, with
the ``triton`` package installed); skipped otherwise."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")

if torch.cuda.is_available():
    DEV = torch.device("cuda")
elif os.environ.get("TRITON_INTERPRET") == "1":
    DEV = torch.device("cpu")
else:
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 to run the kernels on CPU", allow_module_level=True)

from rlforge.rollout.native.triton_sampler import fused_sample  # noqa: E402

DRAWS = 200_000 if DEV.type == "cuda" else 3_000


def _chi2_ok(tok: torch.Tensor, p: torch.Tensor) -> None:
    """``tok`` ([N] draws) follows ``p`` at the 0.999 level (Wilson-Hilferty bound)."""
    counts = torch.bincount(tok.cpu(), minlength=p.numel()).double()
    expected = p.cpu().double() * tok.numel()
    keep = expected > 5
    stat = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    bound = dof * (1 - 2 / (9 * dof) + 3.09 * (2 / (9 * dof)) ** 0.5) ** 3
    assert stat < bound, (stat, bound)


def _lp_ref(rows: torch.Tensor, tok: torch.Tensor, temp: float) -> torch.Tensor:
    return (rows.float() / temp).log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block", [16, 64])
def test_greedy_is_argmax_with_log_softmax(dtype: torch.dtype, block: int) -> None:
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(8, 200, generator=g) * 3).to(dtype).to(DEV)
    logits[3, 150] = logits[3].max() + 1  # the maximum in a later tile
    tok, lp, ok = fused_sample(logits, 0.5, True, None, True, block=block)
    assert bool(ok) and torch.equal(tok, logits.float().argmax(-1))
    torch.testing.assert_close(lp, _lp_ref(logits, tok, 1.0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("temp", [1.0, 0.7])
def test_draws_follow_softmax_across_tiles(temp: float) -> None:
    """40 tokens over three tiles of 16: the running mass is carried from tile to tile."""
    g = torch.Generator().manual_seed(1)
    row = (torch.randn(1, 40, generator=g) * 2).to(torch.bfloat16)
    rows = row.expand(DRAWS, 40).contiguous().to(DEV)
    gen = torch.Generator(device=DEV).manual_seed(2)
    tok, lp, ok = fused_sample(rows, temp, False, gen, True, block=16)
    assert bool(ok)
    _chi2_ok(tok, (row[0].float() / temp).softmax(-1))
    torch.testing.assert_close(lp, _lp_ref(rows, tok, temp), atol=1e-4, rtol=1e-4)


def test_masked_tokens_are_never_drawn() -> None:
    """-inf logits (whole tiles of them, and single entries) get no draws; the rest follow softmax."""
    g = torch.Generator().manual_seed(3)
    row = torch.randn(1, 70, generator=g)
    row[0, 16:32] = float("-inf")  # one whole tile
    row[0, ::5] = float("-inf")
    rows = row.expand(DRAWS, 70).contiguous().to(DEV)
    tok, lp, ok = fused_sample(rows, 1.0, False, torch.Generator(device=DEV).manual_seed(4), True, block=16)
    assert bool(ok)
    assert torch.isfinite(row[0, tok.cpu()]).all()
    _chi2_ok(tok, row[0].softmax(-1))
    assert torch.isfinite(lp).all()


def test_one_live_token_and_bad_rows() -> None:
    """A row with a single finite logit always draws it (log-prob 0); NaN, +inf and all -inf
    rows are flagged."""
    rows = torch.full((4, 50), float("-inf"))
    rows[:, 33] = 2.0
    tok, lp, ok = fused_sample(rows.to(DEV), 1.0, False, None, True, block=16)
    assert bool(ok) and (tok.cpu() == 33).all()
    torch.testing.assert_close(lp.cpu(), torch.zeros(4))
    for bad_value in (float("nan"), float("inf")):
        bad = torch.randn(4, 50)
        bad[2, 7] = bad_value
        assert not bool(fused_sample(bad.to(DEV), 1.0, False, None, False, block=16)[2])
    dead = torch.randn(4, 50)
    dead[1] = float("-inf")
    for greedy in (False, True):
        assert not bool(fused_sample(dead.to(DEV), 1.0, greedy, None, True, block=16)[2])


def test_block_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power of two"):
        fused_sample(torch.zeros(1, 8, device=DEV), 1.0, False, None, False, block=24)

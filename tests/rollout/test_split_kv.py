"""Split-KV (flash-decoding) decode attention on CPU: the torch reference of
rlforge/rollout/native/attention.py against plain softmax(q K^T * scale) V in float64, computed
from each row's own contiguous K/V (not read back through the paged cache), with GQA and
a shuffled block table; and the split-count heuristic."""

from __future__ import annotations

import pytest
import torch

from rlforge.rollout.native.attention import (
    combine_splits,
    decode_attention,
    decode_attention_split_torch,
    decode_attention_torch,
    split_partials_torch,
)
from rlforge.rollout.native.split_kv import MAX_SPLITS, MIN_SPLIT_TOKENS, choose_num_splits

H, KVH, D, BS = 8, 2, 16, 4


def _case(ctx_lens: list[int], seed: int, extra_width: int = 2):
    """Random per-row K/V, scattered into a paged cache through a random block table whose
    unused entries point at random (garbage-filled) blocks; float64 plain-attention reference."""
    g = torch.Generator().manual_seed(seed)
    b = len(ctx_lens)
    width = max(-(-c // BS) for c in ctx_lens) + extra_width
    num_blocks = b * width + 3
    k_cache = torch.randn(num_blocks, BS, KVH, D, generator=g) * 3  # garbage everywhere first
    v_cache = torch.randn(num_blocks, BS, KVH, D, generator=g)
    perm = torch.randperm(num_blocks, generator=g)
    tables = perm[: b * width].view(b, width).to(torch.int32)
    q = torch.randn(b, H, D, generator=g)
    scale = D ** -0.5
    ref = torch.zeros(b, H, D, dtype=torch.float64)
    for i, c in enumerate(ctx_lens):
        k = torch.randn(c, KVH, D, generator=g) * 2  # scores of a few units: a peaked softmax
        v = torch.randn(c, KVH, D, generator=g)
        for t in range(c):
            blk, off = int(tables[i, t // BS]), t % BS
            k_cache[blk, off], v_cache[blk, off] = k[t], v[t]
        if c == 0:
            continue  # a padding row: output 0
        kk = k.double().repeat_interleave(H // KVH, dim=1)  # [c, H, D]: query head h reads KV head h // (H / KVH)
        vv = v.double().repeat_interleave(H // KVH, dim=1)
        p = torch.softmax(torch.einsum("hd,thd->ht", q[i].double(), kk) * scale, dim=-1)
        ref[i] = torch.einsum("ht,thd->hd", p, vv)
    return q, k_cache, v_cache, tables, torch.tensor(ctx_lens, dtype=torch.int32), scale, ref


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


CTX = [0, 1, 3, 4, 17, 50, 33]


@pytest.mark.parametrize("num_splits", [1, 2, 3, 5, 16, 64])
@pytest.mark.parametrize("tile", [BS, 2 * BS])
def test_split_reference_matches_plain_attention(num_splits: int, tile: int) -> None:
    q, kc, vc, bt, cl, scale, ref = _case(CTX, seed=num_splits * 10 + tile)
    out = decode_attention_split_torch(q, kc, vc, bt, cl, scale, num_splits, tile=tile)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert _rel(out, ref) < 1e-5
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # no context: 0, not NaN
    unsplit = decode_attention_torch(q, kc, vc, bt, cl, scale)
    assert _rel(unsplit, ref) < 1e-5  # the unsplit reference agrees with the same plain attention


def test_dispatch_torch_backend_splits() -> None:
    q, kc, vc, bt, cl, scale, ref = _case(CTX, seed=7)
    assert _rel(decode_attention("torch", q, kc, vc, bt, cl, scale, num_splits=4), ref) < 1e-5
    assert _rel(decode_attention("torch", q, kc, vc, bt, cl, scale), ref) < 1e-5


def test_partials_log_sum_exp_and_the_combine_is_needed() -> None:
    """The splits' log-sum-exps combine to the log-sum-exp of all scores, and the test can
    fail: merging the partial outputs without their log-sum-exp weights is far off."""
    ctx = [40, 29, 13]
    q, kc, vc, bt, cl, scale, ref = _case(ctx, seed=3)
    o, lse = split_partials_torch(q, kc, vc, bt, cl, scale, num_splits=4, tile=BS)
    assert o.shape == (3, H, 4, D) and lse.shape == (3, H, 4)
    for i, c in enumerate(ctx):
        k = kc[bt[i].long()].reshape(-1, KVH, D)[:c].double().repeat_interleave(H // KVH, dim=1)
        scores = torch.einsum("hd,thd->ht", q[i].double(), k) * scale
        torch.testing.assert_close(torch.logsumexp(lse[i].double(), -1), torch.logsumexp(scores, -1),
                                   rtol=1e-6, atol=1e-6)
    assert _rel(combine_splits(o, lse), ref) < 1e-5
    naive = o.mean(-2)  # every split weighted equally
    assert _rel(naive, ref) > 1e-2


def test_empty_trailing_splits_are_ignored() -> None:
    """More splits than tiles: the empty ones have lse = -inf and change nothing."""
    q, kc, vc, bt, cl, scale, ref = _case([5, 2], seed=11)
    o, lse = split_partials_torch(q, kc, vc, bt, cl, scale, num_splits=8, tile=BS)
    assert torch.isinf(lse[:, :, 2:]).all() and (lse[:, :, 2:] < 0).all()
    assert torch.isfinite(lse[0, :, :2]).all() and torch.isfinite(lse[1, :, 0]).all()
    assert _rel(combine_splits(o, lse), ref) < 1e-5


def test_num_splits_must_be_positive() -> None:
    q, kc, vc, bt, cl, scale, _ = _case([3], seed=1)
    with pytest.raises(ValueError, match="num_splits"):
        decode_attention_split_torch(q, kc, vc, bt, cl, scale, 0)


def test_choose_num_splits() -> None:
    sms = 132  # an H200
    assert choose_num_splits(1024, 2, 8192, sms) == 1  # enough (sequence, KV head) programs already
    assert choose_num_splits(132, 2, 8192, sms) == 1
    assert choose_num_splits(16, 2, 1024, sms) == 1  # short context: the combine launch is not worth it
    for b, kvh in [(1, 2), (1, 8), (16, 2), (16, 4), (64, 2), (64, 4)]:
        s = choose_num_splits(b, kvh, 8192, sms)
        assert 1 < s <= MAX_SPLITS and s * MIN_SPLIT_TOKENS <= 8192 and s & (s - 1) == 0, (b, kvh, s)
        assert b * kvh * s >= min(2 * sms, b * kvh * min(MAX_SPLITS, 8192 // MIN_SPLIT_TOKENS))  # the SMs get work
    assert choose_num_splits(16, 2, 8192, sms) > choose_num_splits(64, 2, 8192, sms)  # fewer rows, more splits
    assert choose_num_splits(1, 2, 2048, sms) == 2048 // MIN_SPLIT_TOKENS  # capped by tokens per split

"""Split-KV (flash-decoding) Triton decode on the GPU: every split count, and the automatic
choice, against the unsplit kernel and against plain float64 attention, within bf16
tolerance; every output element written; and a CUDA-graph replay with new context lengths.
Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from rlforge.rollout.native.attention import decode_attention  # noqa: E402

CUDA = torch.device("cuda")
BF16_REL = 1e-2  # bf16 operands: 1e-3..1e-2 relative to a float64 reference


def _case(heads: int, kv_heads: int, d: int, bs: int, ctx_lens: list[int], seed: int):
    g = torch.Generator(device=CUDA).manual_seed(seed)
    width = max(-(-c // bs) for c in ctx_lens) + 1
    nblocks = len(ctx_lens) * width + 5
    kc = (torch.randn(nblocks, bs, kv_heads, d, generator=g, device=CUDA) * 2).to(torch.bfloat16)
    vc = torch.randn(nblocks, bs, kv_heads, d, generator=g, device=CUDA, dtype=torch.bfloat16)
    bt = torch.randperm(nblocks, generator=g, device=CUDA)[: len(ctx_lens) * width].view(-1, width).to(torch.int32)
    ctx = torch.tensor(ctx_lens, dtype=torch.int32, device=CUDA)
    q = torch.randn(len(ctx_lens), heads, d, generator=g, device=CUDA, dtype=torch.bfloat16)
    return q, kc, vc, bt, ctx, d ** -0.5


def _plain(q, kc, vc, bt, ctx, scale) -> torch.Tensor:
    """softmax(q K^T * scale) V per row in float64, K/V read by plain indexing, heads repeated for GQA."""
    b, h, d = q.shape
    kvh = kc.shape[2]
    out = torch.zeros(b, h, d, dtype=torch.float64, device=q.device)
    for i in range(b):
        c = int(ctx[i])
        if c == 0:
            continue
        k = kc[bt[i].long()].reshape(-1, kvh, d)[:c].double().repeat_interleave(h // kvh, dim=1)
        v = vc[bt[i].long()].reshape(-1, kvh, d)[:c].double().repeat_interleave(h // kvh, dim=1)
        p = torch.softmax(torch.einsum("hd,thd->ht", q[i].double(), k) * scale, dim=-1)
        out[i] = torch.einsum("ht,thd->hd", p, v)
    return out


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def _poison_allocator() -> None:
    """Leave NaN in the caching allocator's free blocks, so an output element the kernel never
    writes shows up as NaN."""
    x = torch.full((64 * 2**20,), float("nan"), device=CUDA)
    del x


@pytest.mark.parametrize("heads,kv_heads,d,bs", [(14, 2, 64, 16), (28, 4, 128, 16), (8, 8, 64, 32)])
@pytest.mark.parametrize("num_splits", [1, 2, 4, 16, 64, None])
def test_split_matches_unsplit_and_plain_attention(heads, kv_heads, d, bs, num_splits):
    from rlforge.rollout.native.triton_attention import paged_decode_attention

    ctx_lens = [0, 1, 65, 700, 8192, 3000]
    q, kc, vc, bt, ctx, scale = _case(heads, kv_heads, d, bs, ctx_lens, seed=heads + (num_splits or 0))
    ref = _plain(q, kc, vc, bt, ctx, scale)
    unsplit = paged_decode_attention(q, kc, vc, bt, ctx, scale, num_splits=1)
    _poison_allocator()
    got = paged_decode_attention(q, kc, vc, bt, ctx, scale, num_splits=num_splits)
    torch.cuda.synchronize()
    assert torch.isfinite(got).all()
    assert torch.equal(got[0], torch.zeros_like(got[0]))
    assert _rel(unsplit, ref) < BF16_REL
    assert _rel(got, ref) < BF16_REL
    assert _rel(got, unsplit) < BF16_REL
    for i in range(1, len(ctx_lens)):  # row by row too: a long row must not hide a wrong short one
        assert _rel(got[i], ref[i]) < BF16_REL, (i, ctx_lens[i])


def test_auto_splits_small_batch_long_context():
    """The dispatch splits batch 16 at an 8k capacity on this GPU, and stays exact."""
    from rlforge.rollout.native.triton_attention import auto_num_splits

    assert auto_num_splits(16, 2, 8192, CUDA) > 1
    assert auto_num_splits(1024, 2, 8192, CUDA) == 1
    q, kc, vc, bt, ctx, scale = _case(14, 2, 64, 16, [8192 - 7 * i for i in range(16)], seed=5)
    got = decode_attention("triton", q, kc, vc, bt, ctx, scale)
    assert _rel(got, _plain(q, kc, vc, bt, ctx, scale)) < BF16_REL


def test_split_kernel_in_a_cuda_graph():
    """Captured once, replayed after the context lengths change on the device (as the engine's
    decode graphs are): the splits follow the new lengths."""
    from rlforge.rollout.native.triton_attention import paged_decode_attention

    q, kc, vc, bt, ctx, scale = _case(14, 2, 64, 16, [4000, 17, 2048, 1], seed=9)
    paged_decode_attention(q, kc, vc, bt, ctx, scale, num_splits=8)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = paged_decode_attention(q, kc, vc, bt, ctx, scale, num_splits=8)
    # the block tables hold 251 pages x 16 = 4016 tokens a row; the new lengths must fit them
    # (4032 did not: the kernel then read the next row's pages, which plain attention cannot see)
    for lens in ([4000, 17, 2048, 1], [33, 4016, 0, 1500]):
        assert max(lens) <= bt.shape[1] * kc.shape[1]
        ctx.copy_(torch.tensor(lens, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        ref = _plain(q, kc, vc, bt, ctx, scale)
        assert torch.isfinite(out).all()
        for i, c in enumerate(lens):
            if c:
                assert _rel(out[i], ref[i]) < BF16_REL, (lens, i)
            else:
                assert torch.equal(out[i], torch.zeros_like(out[i]))

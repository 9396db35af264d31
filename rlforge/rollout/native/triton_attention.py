"""A Triton paged-attention kernel for decode (one query token per sequence).

One program per (sequence, KV head).  It loads the ``G = H / KVH`` query heads that share
the KV head (padded to 16 rows so ``tl.dot`` runs on tensor cores), then walks the
sequence's context in tiles of ``PAGES * block_size`` tokens: the block table maps each
token to its cache block, the tile's K and V are loaded once for all ``G`` heads, and an
online softmax (running max and sum in float32, as in FlashAttention) accumulates the
output.  The loop bound is the row's context length read on the device, so the launch has
a fixed shape and can be captured in a CUDA graph.  A row with context length 0 (a padding
row of a captured batch) writes zeros.

Bytes per call: every context token's K and V of each KV head are read once, which is the
decode roofline's KV term.  Only imported on CUDA (see :mod:`rlforge.rollout.native.attention`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, o_ptr, scale,
    stride_qb, stride_qh,
    stride_kn, stride_ks, stride_kh,
    stride_btb,
    stride_ob, stride_oh,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, PAGES: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    ctx = tl.load(ctx_ptr + b)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + offs_g
    gmask = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=gmask[:, None], other=0.0)
    TILE: tl.constexpr = BLOCK_SIZE * PAGES
    offs_t = tl.arange(0, TILE)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    for start in range(0, ctx, TILE):
        tok = start + offs_t
        tmask = tok < ctx
        page = tl.load(bt_ptr + b * stride_btb + tok // BLOCK_SIZE, mask=tmask, other=0)
        base = page.to(tl.int64) * stride_kn + (tok % BLOCK_SIZE) * stride_ks + kvh * stride_kh
        k = tl.load(k_ptr + base[:, None] + offs_d[None, :], mask=tmask[:, None], other=0.0)  # [TILE, D]
        v = tl.load(v_ptr + base[:, None] + offs_d[None, :], mask=tmask[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale  # [G, TILE]
        s = tl.where(tmask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
             mask=gmask[:, None])


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, pages_per_tile: int | None = None,
) -> torch.Tensor:
    """``q: [B, H, D]``, caches ``[num_blocks, block_size, KVH, D]`` (contiguous in the last
    three dims), ``block_tables: [B, max_blocks]`` int32, ``context_lens: [B]`` int32 ->
    ``[B, H, D]`` in ``q.dtype``.  ``q``'s dtype must equal the cache's."""
    b, h, d = q.shape
    _, bs, kvh, _ = k_cache.shape
    group = h // kvh
    if pages_per_tile is None:
        pages_per_tile = max(1, 64 // bs)
    q = q.contiguous()
    out = torch.empty_like(q)
    _paged_decode_kernel[(b, kvh)](
        q, k_cache, v_cache, block_tables, context_lens, out, scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=d,
        BLOCK_SIZE=bs, PAGES=pages_per_tile,
        num_warps=4,
    )
    return out

"""A Triton paged-attention kernel for decode (one query token per sequence).

One program per (sequence, KV head, context split).  It loads the ``G = H / KVH`` query
heads that share the KV head (padded to 16 rows so ``tl.dot`` runs on tensor cores), then
walks its part of the sequence's context in tiles of ``PAGES * block_size`` tokens: the
block table maps each token to its cache block, the tile's K and V are loaded once for all
``G`` heads, and an online softmax (running max and sum in float32, as in FlashAttention)
accumulates the output.  The loop bounds come from the row's context length read on the
device, so the launch has a fixed shape and can be captured in a CUDA graph.  A row with
context length 0 (a padding row of a captured batch) writes zeros.

Split-KV (flash-decoding, Dao et al. 2023): with ``num_splits = S > 1`` the context of each
row is cut into ``S`` chunks of whole tiles (:func:`~rlforge.rollout.native.attention.split_bounds`),
each program writes its chunk's normalised partial output and log-sum-exp (float32), and a
second kernel merges the ``S`` partials of each (sequence, head) by their log-sum-exp weights,
as :func:`~rlforge.rollout.native.attention.combine_splits` does.  This gives a small batch at
long context ``S`` times the programs, so it fills the GPU; ``num_splits=None`` picks ``S`` with
:func:`~rlforge.rollout.native.split_kv.choose_num_splits` from the batch, the KV heads, the
block table's capacity (static under a CUDA graph) and the SM count.

Bytes per call: every context token's K and V of each KV head are read once (the decode
roofline's KV term), plus, when split, ``B * H * S * (D + 1)`` float32 partials written and read
once.  Only imported on CUDA (see :mod:`rlforge.rollout.native.attention`).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from rlforge.rollout.native.split_kv import choose_num_splits


@triton.jit
def _paged_decode_kernel(
    q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, o_ptr, po_ptr, plse_ptr, scale,
    stride_qb, stride_qh,
    stride_kn, stride_ks, stride_kh,
    stride_btb,
    stride_ob, stride_oh,
    num_heads,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, PAGES: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    ctx = tl.load(ctx_ptr + b)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + offs_g
    gmask = offs_g < GROUP
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :], mask=gmask[:, None], other=0.0)
    TILE: tl.constexpr = BLOCK_SIZE * PAGES
    offs_t = tl.arange(0, TILE)
    if NUM_SPLITS == 1:
        lo = 0
        hi = ctx
    else:  # whole tiles per split, as attention.split_bounds: ceil(ceil(ctx / TILE) / S), at least 1
        per = tl.maximum(tl.cdiv(tl.cdiv(ctx, TILE), NUM_SPLITS), 1) * TILE
        lo = split * per
        hi = tl.minimum(lo + per, ctx)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    for start in range(lo, hi, TILE):
        tok = start + offs_t
        tmask = tok < hi
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
    if NUM_SPLITS == 1:
        tl.store(o_ptr + b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(o_ptr.dtype.element_ty), mask=gmask[:, None])
    else:  # partials [B, H, S, D] and [B, H, S], contiguous
        row = (b * num_heads + heads) * NUM_SPLITS + split  # [GROUP_PAD]
        tl.store(po_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], out, mask=gmask[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(plse_ptr + row, lse, mask=gmask)


@triton.jit
def _combine_splits_kernel(
    po_ptr, plse_ptr, o_ptr, stride_ob, stride_oh, num_heads,
    NUM_SPLITS: tl.constexpr, SPLITS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, SPLITS_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    smask = offs_s < NUM_SPLITS
    row = (b * num_heads + h) * NUM_SPLITS + offs_s
    lse = tl.load(plse_ptr + row, mask=smask, other=float("-inf"))
    mx = tl.max(lse, 0)
    mx = tl.where(mx > float("-inf"), mx, 0.0)  # every split empty (no context): weights 0, output 0
    w = tl.exp(lse - mx)
    den = tl.sum(w, 0)
    o = tl.load(po_ptr + row[:, None] * HEAD_DIM + offs_d[None, :], mask=smask[:, None], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.where(den > 0, den, 1.0)
    tl.store(o_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(o_ptr.dtype.element_ty))


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _device_sms(device: torch.device) -> int:
    """Multiprocessors of CUDA ``device`` (the current device when it has no index)."""
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def auto_num_splits(batch: int, kv_heads: int, max_context: int, device: torch.device) -> int:
    """:func:`~rlforge.rollout.native.split_kv.choose_num_splits` with ``device``'s SM count."""
    return choose_num_splits(batch, kv_heads, max_context, _device_sms(device))


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, pages_per_tile: int | None = None, num_splits: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """``q: [B, H, D]``, caches ``[num_blocks, block_size, KVH, D]`` (contiguous in the last
    three dims), ``block_tables: [B, max_blocks]`` int32, ``context_lens: [B]`` int32 ->
    ``[B, H, D]`` in ``q.dtype``.  ``q``'s dtype must equal the cache's.  ``num_splits``:
    context splits (None = automatic, see the module docstring; 1 = the unsplit kernel).
    ``pages_per_tile`` (cache blocks per loop step, None = 64 tokens) and ``num_warps`` (None: 2 for
    the unsplit kernel when ``B * KVH`` is at least twice the SM count, else 4; the H200 sweep of
    2026-12-01 found 2 warps fastest at B=1024 x 512 and 7B B=256, 5-6% faster) are launch settings
    that change the speed, not the result.  Raises ValueError for ``num_splits < 1``."""
    b, h, d = q.shape
    _, bs, kvh, _ = k_cache.shape
    group = h // kvh
    if pages_per_tile is None:
        pages_per_tile = max(1, 64 // bs)
    if num_splits is None:
        num_splits = auto_num_splits(b, kvh, block_tables.shape[1] * bs, q.device)
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    if num_warps is None:
        num_warps = 2 if q.is_cuda and num_splits == 1 and b * kvh >= 2 * _device_sms(q.device) else 4
    q = q.contiguous()
    out = torch.empty_like(q)
    if num_splits > 1:
        po = torch.empty((b, h, num_splits, d), dtype=torch.float32, device=q.device)
        plse = torch.empty((b, h, num_splits), dtype=torch.float32, device=q.device)
    else:
        po = plse = out  # not read or written by the unsplit kernel
    _paged_decode_kernel[(b, kvh, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, po, plse, scale,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_tables.stride(0),
        out.stride(0), out.stride(1),
        h,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=d,
        BLOCK_SIZE=bs, PAGES=pages_per_tile, NUM_SPLITS=num_splits,
        num_warps=num_warps,
    )
    if num_splits > 1:
        pad = max(2, triton.next_power_of_2(num_splits))
        _combine_splits_kernel[(b, h)](
            po, plse, out, out.stride(0), out.stride(1), h,
            NUM_SPLITS=num_splits, SPLITS_PAD=pad, HEAD_DIM=d,
            num_warps=4 if pad * d > 2048 else 2,  # the [S, D] float32 tile stays in registers
        )
    return out

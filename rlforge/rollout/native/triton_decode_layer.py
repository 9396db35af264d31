"""One persistent Triton kernel per decoder layer for small decode batches.

A decode step of a small model at a small batch is latency-bound: at B = 16 rows of 8k
context, Qwen2.5-0.5B ran ~12 kernels per layer (fused add + RMSNorm, the Q/K/V GEMM, RoPE +
KV write, split attention, its combine, the O GEMM, add + RMSNorm, gate/up, SiLU·mul, down,
cuBLAS split-K reductions), each a launch, a ramp and a tail of 2-7 us around 0.3-4 MB of
reads: 0.34 of the step's bandwidth floor (``benchmarks/history/RESULTS-log.md``, 2026-12-02).

Here one launch of ``G`` programs (one per SM, all resident) runs the whole layer in five
phases, separated by grid-wide barriers (an atomic counter; ``tl.debug_barrier`` orders each
program's threads around it):

A. RMSNorm of the residual ``h`` (every program recomputes the row statistics from ``h``),
   the packed Q/K/V GEMM in tiles of 16 output columns, RoPE on each tile (a tile holds 8
   column pairs ``(c, c + D/2)`` of one head), and the store of Q, and of K and V into the
   token's cache slot.
B. Paged attention, one work item per (row, KV head, context split) with the split's K/V
   tiles double-buffered; the last split of a (row, KV head) to finish (an atomic count per
   pair) merges the partials by their log-sum-exp, as flash-decoding does.
C. The O GEMM in tiles of 8 columns, and the residual add into ``h`` (each tile owns its columns).
D. RMSNorm of ``h``, the packed gate/up GEMM in tiles of 8 gate and 8 up columns, SiLU·mul.
E. The down GEMM in tiles of 8 columns, and the residual add into ``h``.

The layer's next launch is the barrier after E.  Numerics follow
:meth:`~rlforge.rollout.native.model_runner.ModelRunner._body_fused`: every GEMM output, the
normed rows and the RoPE products are rounded to the compute dtype where torch rounds them, so
the results agree with the op-by-op path to the rounding of a different summation order
(the tests compare them).  Phase ``p`` alone runs with ``PHASE=p`` (the CPU interpreter runs
the five phases as five launches: its programs run one after another, so a barrier would wait
forever).

Bytes per layer: the layer's weights once, every context token's K and V once, plus
``B x hidden`` rows and the split partials through L2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from rlforge.rollout.native.triton_fused import _rot


@triton.jit
def _grid_sync(bar_ptr, target):
    """Wait until ``target`` arrivals at ``bar_ptr`` (this program's included); orders the
    program's earlier stores before every program's later loads.  (Spinning on volatile loads
    instead of acquiring atomics measured the same, 2026-12-02.)"""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _row_rstd(h_ptr, offs_m, mrow, stride_h, eps, HID: tl.constexpr, BK: tl.constexpr):
    """``rsqrt(mean(h^2) + eps)`` per row, float32 ``[ROWS]``."""
    acc = tl.zeros([offs_m.shape[0]], dtype=tl.float32)
    for k0 in range(0, HID, BK):
        offs_k = k0 + tl.arange(0, BK)
        x = tl.load(h_ptr + offs_m[:, None] * stride_h + offs_k[None, :],
                    mask=mrow[:, None] & (offs_k < HID)[None, :], other=0.0, cache_modifier=".cg").to(tl.float32)
        acc += tl.sum(x * x, 1)
    return tl.math.rsqrt(acc / HID + eps)


@triton.jit
def _normed(h_ptr, ln_ptr, rstd, offs_m, mrow, offs_k, stride_h, HID: tl.constexpr):
    """``ln * rms_norm(h)`` for columns ``offs_k``, rounded as the fused add + RMSNorm kernel rounds."""
    kmask = offs_k < HID
    x = tl.load(h_ptr + offs_m[:, None] * stride_h + offs_k[None, :], mask=mrow[:, None] & kmask[None, :],
                other=0.0, cache_modifier=".cg")
    xn = (x.to(tl.float32) * rstd[:, None]).to(x.dtype)
    w = tl.load(ln_ptr + offs_k, mask=kmask, other=0.0)
    return (w.to(tl.float32)[None, :] * xn.to(tl.float32)).to(x.dtype)


@triton.jit
def _normed_rows(h_ptr, ln_ptr, eps, B, stride_h, HID: tl.constexpr, ROWS: tl.constexpr, BK: tl.constexpr):
    """The row offsets, their mask, ``rstd`` and the normed rows of the first ``BK`` columns (all
    of them when ``HID <= BK``, from one read of ``h``) that a normed-GEMM phase starts from."""
    offs_m = tl.arange(0, ROWS)
    mrow = offs_m < B
    if HID <= BK:
        offs_k = tl.arange(0, BK)
        kmask = offs_k < HID
        x = tl.load(h_ptr + offs_m[:, None] * stride_h + offs_k[None, :], mask=mrow[:, None] & kmask[None, :],
                    other=0.0, cache_modifier=".cg")
        xf = x.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(xf * xf, 1) / HID + eps)
        w = tl.load(ln_ptr + offs_k, mask=kmask, other=0.0)
        x_all = (w.to(tl.float32)[None, :] * (xf * rstd[:, None]).to(x.dtype).to(tl.float32)).to(x.dtype)
    else:
        rstd = _row_rstd(h_ptr, offs_m, mrow, stride_h, eps, HID, BK)
        x_all = _normed(h_ptr, ln_ptr, rstd, offs_m, mrow, tl.arange(0, BK), stride_h, HID)
    return offs_m, mrow, rstd, x_all


@triton.jit
def _normed_gemm_tile(h_ptr, ln_ptr, rstd, x_all, offs_m, mrow, w_ptr, rows_w, stride_h, HID: tl.constexpr,
                      ROWS: tl.constexpr, BK: tl.constexpr):
    """``normed(h) @ W[rows_w]^T``, float32 ``[ROWS, 16]``: from ``x_all`` (the normed rows, loaded
    once per program) when ``HID <= BK``, else chunk by chunk."""
    acc = tl.zeros([ROWS, 16], dtype=tl.float32)
    if HID <= BK:
        offs_k = tl.arange(0, BK)
        w = tl.load(w_ptr + rows_w[:, None] * HID + offs_k[None, :], mask=(offs_k < HID)[None, :], other=0.0)
        acc = tl.dot(x_all, tl.trans(w), acc)
    else:
        for k0 in range(0, HID, BK):
            offs_k = k0 + tl.arange(0, BK)
            w = tl.load(w_ptr + rows_w[:, None] * HID + offs_k[None, :], mask=(offs_k < HID)[None, :], other=0.0)
            x = _normed(h_ptr, ln_ptr, rstd, offs_m, mrow, offs_k, stride_h, HID)
            acc = tl.dot(x, tl.trans(w), acc)
    return acc


@triton.jit
def _phase_qkv(
    pid, G, B, h_ptr, ln_ptr, eps, w_ptr, b_ptr, cos_ptr, sin_ptr, slot_ptr, q_ptr, kc_ptr, vc_ptr,
    stride_h, stride_cs, stride_ch,
    HID: tl.constexpr, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, ROWS: tl.constexpr,
    BK: tl.constexpr, HAS_BIAS: tl.constexpr, BF16: tl.constexpr,
):
    offs_m, mrow, rstd, x_all = _normed_rows(h_ptr, ln_ptr, eps, B, stride_h, HID, ROWS, BK)
    j = tl.arange(0, 16)
    half = tl.arange(0, 8)
    PARTS: tl.constexpr = D // 16
    n_tiles = (H + 2 * KVH) * PARTS
    slot = tl.load(slot_ptr + offs_m, mask=mrow, other=0).to(tl.int64)
    for t in range(pid, n_tiles, G):
        head = t // PARTS
        part = t % PARTS
        # interleaved columns: even j -> first half c, odd j -> c + D/2 (the pair RoPE rotates together)
        cols = head * D + part * 8 + j // 2 + (j % 2) * (D // 2)
        acc = _normed_gemm_tile(h_ptr, ln_ptr, rstd, x_all, offs_m, mrow, w_ptr, cols, stride_h, HID, ROWS, BK)
        if HAS_BIAS:
            acc += tl.load(b_ptr + cols).to(tl.float32)[None, :]
        y = acc.to(cos_ptr.dtype.element_ty)
        x1, x2 = tl.split(tl.reshape(y, [ROWS, 8, 2]))  # columns c and c + D/2, [ROWS, 8] each
        c = part * 8 + half  # the pair's first-half column within the head
        cb = offs_m[:, None] * D + c[None, :]
        c1 = tl.load(cos_ptr + cb, mask=mrow[:, None], other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptr + cb + D // 2, mask=mrow[:, None], other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptr + cb, mask=mrow[:, None], other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptr + cb + D // 2, mask=mrow[:, None], other=0.0).to(tl.float32)
        r1 = _rot(x1, x2, c1, s1, False, BF16).to(y.dtype)
        r2 = _rot(x2, x1, c2, s2, True, BF16).to(y.dtype)
        if head < H:  # a query head
            qb = q_ptr + offs_m[:, None] * (H * D) + head * D + c[None, :]
            tl.store(qb, r1, mask=mrow[:, None])
            tl.store(qb + D // 2, r2, mask=mrow[:, None])
        elif head < H + KVH:  # a key head, rotated, into the row's cache slot
            kb = kc_ptr + slot[:, None] * stride_cs + (head - H) * stride_ch + c[None, :]
            tl.store(kb, r1.to(kc_ptr.dtype.element_ty), mask=mrow[:, None])
            tl.store(kb + D // 2, r2.to(kc_ptr.dtype.element_ty), mask=mrow[:, None])
        else:  # a value head, not rotated
            vb = vc_ptr + slot[:, None] * stride_cs + (head - H - KVH) * stride_ch + c[None, :]
            tl.store(vb, x1.to(vc_ptr.dtype.element_ty), mask=mrow[:, None])
            tl.store(vb + D // 2, x2.to(vc_ptr.dtype.element_ty), mask=mrow[:, None])


@triton.jit
def _kv_pages(bt_ptr, b, start, hi, offs_t, stride_btb, BLOCK_SIZE: tl.constexpr):
    """The cache pages of context tokens ``start + offs_t`` of row ``b``, and their mask (``< hi``)."""
    tok = start + offs_t
    tmask = tok < hi
    return tl.load(bt_ptr + b * stride_btb + tok // BLOCK_SIZE, mask=tmask, other=0), tmask


@triton.jit
def _kv_tile(k_ptr, v_ptr, page, tmask, kvh, start, offs_t, offs_d, stride_kn, stride_ks, stride_kh,
             BLOCK_SIZE: tl.constexpr):
    """K and V of one tile of tokens whose pages were loaded a tile earlier (read once: evict first)."""
    base = page.to(tl.int64) * stride_kn + ((start + offs_t) % BLOCK_SIZE) * stride_ks + kvh * stride_kh
    k = tl.load(k_ptr + base[:, None] + offs_d[None, :], mask=tmask[:, None], other=0.0,
                eviction_policy="evict_first")
    v = tl.load(v_ptr + base[:, None] + offs_d[None, :], mask=tmask[:, None], other=0.0,
                eviction_policy="evict_first")
    return k, v


@triton.jit
def _phase_attention(
    pid, G, B, q_ptr, k_ptr, v_ptr, bt_ptr, ctx_ptr, po_ptr, plse_ptr, cnt_ptr, a_ptr, scale,
    stride_btb, stride_kn, stride_ks, stride_kh,
    H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr, S: tl.constexpr, S_PAD: tl.constexpr,
):
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, D)
    offs_t = tl.arange(0, TILE)
    gmask = offs_g < GROUP
    for it in range(pid, B * KVH * S, G):
        b = it // (KVH * S)
        kvh = (it // S) % KVH
        split = it % S
        ctx = tl.load(ctx_ptr + b)
        heads = kvh * GROUP + offs_g
        q = tl.load(q_ptr + b * (H * D) + heads[:, None] * D + offs_d[None, :], mask=gmask[:, None], other=0.0,
                    cache_modifier=".cg")
        per = tl.maximum(tl.cdiv(tl.cdiv(ctx, TILE), S), 1) * TILE  # whole tiles per split (attention.split_bounds)
        lo = split * per
        hi = tl.minimum(lo + per, ctx)
        m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
        acc = tl.zeros([GROUP_PAD, D], dtype=tl.float32)
        # pages two tiles ahead, K/V one tile ahead of the tile in use: a tile's loads never wait
        # on its own page lookup
        page, tmask = _kv_pages(bt_ptr, b, lo, hi, offs_t, stride_btb, BLOCK_SIZE)
        k, v = _kv_tile(k_ptr, v_ptr, page, tmask, kvh, lo, offs_t, offs_d, stride_kn, stride_ks, stride_kh,
                        BLOCK_SIZE)
        page_n, tmask_n = _kv_pages(bt_ptr, b, lo + TILE, hi, offs_t, stride_btb, BLOCK_SIZE)
        for start in range(lo, hi, TILE):
            page_nn, tmask_nn = _kv_pages(bt_ptr, b, start + 2 * TILE, hi, offs_t, stride_btb, BLOCK_SIZE)
            k_n, v_n = _kv_tile(k_ptr, v_ptr, page_n, tmask_n, kvh, start + TILE, offs_t, offs_d, stride_kn,
                                stride_ks, stride_kh, BLOCK_SIZE)
            s = tl.dot(q, tl.trans(k)).to(tl.float32) * scale
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.exp(s - m_new[:, None])
            alpha = tl.exp(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
            m_i = m_new
            k, v, tmask = k_n, v_n, tmask_n
            page_n, tmask_n = page_nn, tmask_nn
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        a_rows = a_ptr + b * (H * D) + heads[:, None] * D + offs_d[None, :]
        if S == 1:
            tl.store(a_rows, out.to(a_ptr.dtype.element_ty), mask=gmask[:, None])
        else:
            row = (b * H + heads) * S + split
            tl.store(po_ptr + row[:, None] * D + offs_d[None, :], out, mask=gmask[:, None])
            lse = tl.where(l_i > 0, m_i + tl.log(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
            tl.store(plse_ptr + row, lse, mask=gmask)
            tl.debug_barrier()
            done = tl.atomic_add(cnt_ptr + b * KVH + kvh, 1, sem="acq_rel", scope="gpu")
            if done == S - 1:  # the last split of (b, kvh): merge the S partials of its GROUP heads
                tl.debug_barrier()
                offs_s = tl.arange(0, S_PAD)
                base = (b * H + heads) * S
                lse_all = tl.load(plse_ptr + base[:, None] + offs_s[None, :],
                                  mask=gmask[:, None] & (offs_s < S)[None, :], other=float("-inf"),
                                  cache_modifier=".cg")
                mx = tl.max(lse_all, 1)
                mx = tl.where(mx > float("-inf"), mx, 0.0)
                w_all = tl.exp(lse_all - mx[:, None])
                den = tl.sum(w_all, 1)
                merged = tl.zeros([GROUP_PAD, D], dtype=tl.float32)
                for sp in tl.static_range(S):
                    o_s = tl.load(po_ptr + (base + sp)[:, None] * D + offs_d[None, :], mask=gmask[:, None],
                                  other=0.0, cache_modifier=".cg")
                    w_s = tl.sum(tl.where(offs_s[None, :] == sp, w_all, 0.0), 1)
                    merged += w_s[:, None] * o_s
                merged = merged / tl.where(den > 0, den, 1.0)[:, None]
                tl.store(a_rows, merged.to(a_ptr.dtype.element_ty), mask=gmask[:, None])
                tl.atomic_xchg(cnt_ptr + b * KVH + kvh, 0)  # ready for the next layer


@triton.jit
def _phase_linear_residual(
    pid, G, B, x_ptr, w_ptr, h_ptr, stride_x, stride_h,
    N: tl.constexpr, K: tl.constexpr, ROWS: tl.constexpr, BK: tl.constexpr,
):
    """``h[:, cols] = h[:, cols] + x @ W[cols]^T`` (each rounded to the compute dtype), 8 columns per tile."""
    offs_m = tl.arange(0, ROWS)
    mrow = offs_m < B
    j = tl.arange(0, 16)
    for t in range(pid, N // 8, G):
        cols = t * 8 + j
        cmask = j < 8
        acc = tl.zeros([ROWS, 16], dtype=tl.float32)
        for k0 in range(0, K, BK):
            offs_k = k0 + tl.arange(0, BK)
            kmask = offs_k < K
            w = tl.load(w_ptr + cols[:, None] * K + offs_k[None, :], mask=cmask[:, None] & kmask[None, :], other=0.0)
            x = tl.load(x_ptr + offs_m[:, None] * stride_x + offs_k[None, :], mask=mrow[:, None] & kmask[None, :],
                        other=0.0, cache_modifier=".cg")
            acc = tl.dot(x, tl.trans(w), acc)
        hp = h_ptr + offs_m[:, None] * stride_h + cols[None, :]
        hm = mrow[:, None] & cmask[None, :]
        h = tl.load(hp, mask=hm, other=0.0, cache_modifier=".cg")
        y = acc.to(h.dtype)
        tl.store(hp, (h.to(tl.float32) + y.to(tl.float32)).to(h.dtype), mask=hm)


@triton.jit
def _phase_gate_up(
    pid, G, B, h_ptr, ln_ptr, eps, w_ptr, act_ptr, stride_h,
    HID: tl.constexpr, INTER: tl.constexpr, ROWS: tl.constexpr, BK: tl.constexpr,
):
    offs_m, mrow, rstd, x_all = _normed_rows(h_ptr, ln_ptr, eps, B, stride_h, HID, ROWS, BK)
    j = tl.arange(0, 16)
    half = tl.arange(0, 8)
    for t in range(pid, INTER // 8, G):
        rows_w = t * 8 + j // 2 + (j % 2) * INTER  # even j: gate column, odd j: the same up column
        acc = _normed_gemm_tile(h_ptr, ln_ptr, rstd, x_all, offs_m, mrow, w_ptr, rows_w, stride_h, HID, ROWS, BK)
        y = acc.to(act_ptr.dtype.element_ty)
        g, u = tl.split(tl.reshape(y, [ROWS, 8, 2]))
        gf = g.to(tl.float32)
        a = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # F.silu, rounded to the compute dtype
        out = (a.to(tl.float32) * u.to(tl.float32)).to(g.dtype)
        tl.store(act_ptr + offs_m[:, None] * INTER + t * 8 + half[None, :], out, mask=mrow[:, None])


@triton.jit
def _decode_layer_kernel(
    h_ptr, ln1_ptr, ln2_ptr, eps, eps2, wqkv_ptr, bqkv_ptr, cos_ptr, sin_ptr, slot_ptr, kc_ptr, vc_ptr, bt_ptr, ctx_ptr,
    q_ptr, po_ptr, plse_ptr, cnt_ptr, a_ptr, wo_ptr, wgu_ptr, act_ptr, wd_ptr, bar_ptr, scale, B, G,
    stride_h, stride_kn, stride_ks, stride_kh, stride_btb,
    HID: tl.constexpr, H: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, INTER: tl.constexpr,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, ROWS: tl.constexpr,
    BK: tl.constexpr, BK_DOWN: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE: tl.constexpr,
    S: tl.constexpr, S_PAD: tl.constexpr, HAS_BIAS: tl.constexpr, BF16: tl.constexpr, PHASE: tl.constexpr,
):
    pid = tl.program_id(0)
    if PHASE < 0 or PHASE == 0:
        _phase_qkv(pid, G, B, h_ptr, ln1_ptr, eps, wqkv_ptr, bqkv_ptr, cos_ptr, sin_ptr, slot_ptr, q_ptr, kc_ptr,
                   vc_ptr, stride_h, stride_ks, stride_kh, HID, H, KVH, D, ROWS, BK, HAS_BIAS, BF16)
    if PHASE < 0:
        _grid_sync(bar_ptr, G)
    if PHASE < 0 or PHASE == 1:
        _phase_attention(pid, G, B, q_ptr, kc_ptr, vc_ptr, bt_ptr, ctx_ptr, po_ptr, plse_ptr, cnt_ptr, a_ptr, scale,
                         stride_btb, stride_kn, stride_ks, stride_kh, H, KVH, D, GROUP, GROUP_PAD, BLOCK_SIZE, TILE,
                         S, S_PAD)
    if PHASE < 0:
        _grid_sync(bar_ptr, 2 * G)
    if PHASE < 0 or PHASE == 2:
        _phase_linear_residual(pid, G, B, a_ptr, wo_ptr, h_ptr, H * D, stride_h, HID, H * D, ROWS, BK)
    if PHASE < 0:
        _grid_sync(bar_ptr, 3 * G)
    if PHASE < 0 or PHASE == 3:
        _phase_gate_up(pid, G, B, h_ptr, ln2_ptr, eps2, wgu_ptr, act_ptr, stride_h, HID, INTER, ROWS, BK)
    if PHASE < 0:
        _grid_sync(bar_ptr, 4 * G)
    if PHASE < 0 or PHASE == 4:
        _phase_linear_residual(pid, G, B, act_ptr, wd_ptr, h_ptr, INTER, stride_h, HID, INTER, ROWS, BK_DOWN)


MAX_ROWS = 16
"""Most decode rows the layer kernel takes (one ``[ROWS, hidden]`` tile of activations per program;
at 32 rows the 7B shape and at 64 rows both Qwen2.5 shapes asked for 266-494 KB of shared memory,
more than an H200 has)."""
ATTENTION_TILE = 128
"""Context tokens per attention loop step (K and V of one tile: 32 KB at head dim 64)."""
PHASES = 5


def unsupported_reason(runner) -> str | None:  # noqa: ANN001 - a ModelRunner (import cycle)
    """Why :class:`DecodeLayerKernel` cannot run ``runner``'s model (None when it can)."""
    s, m = runner.spec, runner.module.model
    dtype = runner.cache.data.dtype
    if dtype not in (torch.bfloat16, torch.float16):
        return f"compute dtype {dtype} is not bfloat16 or float16"
    if m.embed_tokens.weight.dtype != dtype:
        return "the embedding's dtype is not the compute dtype"
    if s.head_dim not in (64, 128):
        return f"head dim {s.head_dim} is not 64 or 128"
    if runner.cache.block_size > ATTENTION_TILE or ATTENTION_TILE % runner.cache.block_size:
        return f"KV block size {runner.cache.block_size} does not divide {ATTENTION_TILE}"
    for i, layer in enumerate(m.layers):
        lw = runner.weights.layers[i]
        if getattr(layer.self_attn, "q_norm", None) is not None:
            return "per-head q/k norms (Qwen3) are not fused"
        if len(lw.qkv) != 1 or len(lw.gate_up) != 1:
            return "Q/K/V and gate/up must be packed (pack=True)"
        if lw.o.bias is not None or lw.down.bias is not None or lw.gate_up[0].bias is not None:
            return "biases on o_proj, gate_up or down_proj are not fused"
        for ln in (layer.input_layernorm, layer.post_attention_layernorm):
            if ln.weight.dtype != dtype:
                return "a layer norm's weight is not in the compute dtype"
        if lw.gate_up[0].weight.shape[0] % 16 or lw.o.weight.shape[0] % 8:
            return "hidden or intermediate size not a multiple of 8"
    return None


def num_splits_for(batch: int, kv_heads: int, max_context: int, programs: int, tile: int = ATTENTION_TILE) -> int:
    """Context splits per (row, KV head): the largest power of two with ``batch * kv_heads * S <=
    programs`` and at least one attention tile of ``tile`` tokens per split at the block table's
    capacity."""
    s = 1
    while batch * kv_heads * s * 2 <= programs and max_context // (s * 2) >= tile and s < 64:
        s *= 2
    return s


class DecodeLayerKernel:
    """Runs every decoder layer of ``runner``'s model on decode rows with :func:`_decode_layer_kernel`.

    ``num_programs``: the grid (None = the SM count on CUDA, where all programs must be
    resident at once; 3 on CPU under the interpreter, whose phases run as separate launches).
    ``num_warps``: per program.  ``attention_tile``: context tokens per attention loop step (a
    multiple of :data:`ATTENTION_TILE`; the next tile's K/V and the one after's pages are in flight
    while a tile is used; 256 needs 8 warps, benchmarks/history/RESULTS-log.md 2026-12-02).
    Raises ValueError when :func:`unsupported_reason` gives a reason, or for an ``attention_tile``
    that is not a multiple of :data:`ATTENTION_TILE`.
    """

    def __init__(self, runner, num_programs: int | None = None, num_warps: int = 8,  # noqa: ANN001
                 attention_tile: int = ATTENTION_TILE) -> None:
        why = unsupported_reason(runner)
        if why is not None:
            raise ValueError(f"the decode layer kernel cannot run this model: {why}")
        self.runner = runner
        dev = runner.cache.data.device
        if num_programs is None:
            num_programs = torch.cuda.get_device_properties(dev).multi_processor_count if dev.type == "cuda" else 3
        if attention_tile < ATTENTION_TILE or attention_tile % ATTENTION_TILE or attention_tile & (attention_tile - 1):
            raise ValueError(f"attention_tile must be a power-of-two multiple of {ATTENTION_TILE}, got {attention_tile}")
        self.num_programs = num_programs
        self.num_warps = num_warps
        self.attention_tile = attention_tile
        # the interpreter runs programs one after another, so each phase is its own launch there;
        # (-1,) = all five phases in one launch (a benchmark may time one phase alone: (p,))
        self.phases: tuple[int, ...] = (-1,) if dev.type == "cuda" else tuple(range(PHASES))

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions_slots: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
        """``h: [B, hidden]`` embeddings -> the last layer's output ``[B, hidden]`` (a new tensor);
        ``cos``, ``sin``: ``[B, D]``; ``positions_slots``: ``[B]`` int64 KV slots of the new tokens;
        ``block_tables: [B, max_blocks]`` int32; ``context_lens: [B]`` int32 (new token included).
        Writes each layer's new K/V into the cache.  Raises ValueError for more than
        :data:`MAX_ROWS` rows."""
        r = self.runner
        s, m, cache = r.spec, r.module.model, r.cache
        b, hid = h.shape
        if b > MAX_ROWS:
            raise ValueError(f"the decode layer kernel takes at most {MAX_ROWS} rows, got {b}")
        dev, dt = h.device, h.dtype
        h = h.contiguous().clone()
        inter = r.weights.layers[0].down.weight.shape[1]
        bs = cache.block_size
        tile = self.attention_tile
        splits = num_splits_for(b, s.num_kv_heads, block_tables.shape[1] * bs, self.num_programs, tile)
        q = torch.empty((b, s.num_heads * s.head_dim), dtype=dt, device=dev)
        po = torch.empty((b, s.num_heads, splits, s.head_dim), dtype=torch.float32, device=dev)
        plse = torch.empty((b, s.num_heads, splits), dtype=torch.float32, device=dev)
        cnt = torch.zeros(b * s.num_kv_heads, dtype=torch.int32, device=dev)
        a = torch.empty((b, s.num_heads * s.head_dim), dtype=dt, device=dev)
        act = torch.empty((b, inter), dtype=dt, device=dev)
        bar = torch.zeros(s.num_layers, dtype=torch.int32, device=dev)
        cos, sin = cos.contiguous(), sin.contiguous()
        group = s.num_heads // s.num_kv_heads
        bk = triton.next_power_of_2(hid) if hid <= 2048 else 1024
        rows = max(16, triton.next_power_of_2(b))
        for i, layer in enumerate(m.layers):
            lw = r.weights.layers[i]
            qkv = lw.qkv[0]
            kc, vc = cache.data[i, 0], cache.data[i, 1]
            for phase in self.phases:
                _decode_layer_kernel[(self.num_programs,)](
                    h, layer.input_layernorm.weight, layer.post_attention_layernorm.weight,
                    float(layer.input_layernorm.variance_epsilon),
                    float(layer.post_attention_layernorm.variance_epsilon), qkv.weight,
                    qkv.bias if qkv.bias is not None else qkv.weight, cos, sin, positions_slots, kc, vc,
                    block_tables, context_lens, q, po, plse, cnt, a, lw.o.weight, lw.gate_up[0].weight, act,
                    lw.down.weight, bar[i:], r.scale, b, self.num_programs,
                    h.stride(0), kc.stride(0), kc.stride(1), kc.stride(2), block_tables.stride(0),
                    HID=hid, H=s.num_heads, KVH=s.num_kv_heads, D=s.head_dim, INTER=inter,
                    GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), ROWS=rows,
                    BK=bk, BK_DOWN=min(1024, triton.next_power_of_2(inter)), BLOCK_SIZE=bs, TILE=tile,
                    S=splits, S_PAD=max(2, triton.next_power_of_2(splits)), HAS_BIAS=qkv.bias is not None,
                    BF16=dt == torch.bfloat16, PHASE=phase,
                    num_warps=self.num_warps, enable_fp_fusion=False,
                )
        return h

"""Fused Triton kernels for the elementwise work of one decoder layer in the native rollout.

Eager torch spends about 30 kernel launches per layer on RMSNorm (cast, square, mean, rsqrt,
two multiplies, cast back), rotate-half RoPE (slices, negation, concatenation, multiplies,
add, for Q and K), the K/V cache writes, SiLU·mul and the residual adds.  At decode batch
sizes each of them moves a few megabytes and costs its launch more than its bytes (the
0.5B decode step's profile, in ``benchmarks/history/RESULTS-log.md``: ~185 such launches per step,
~1.6 ms of a 9.8 ms step).  These kernels do that work in four launches per layer:

- :func:`add_rms_norm`: ``residual + x`` then RMSNorm of the sum (one read of each, one
  write of the sum and of the normalised rows);
- :func:`rope_and_cache`: RoPE of Q and K and the store of K and V into their paged-cache
  slots, in one pass over the token's heads;
- :func:`silu_mul`: ``silu(gate) * up``.

Numerics follow the eager path op by op (transformers' ``modeling_llama.py``): every
intermediate that torch rounds to the compute dtype is rounded here too (in RoPE with integer
bit operations, which no compiler folds away), so in bfloat16 the residual adds, SiLU·mul and
RoPE equal torch's bit for bit (float32 RoPE too: the kernel is compiled without FMA
contraction, which the H200 run showed rounding ``x1 * c + x2 * s`` once where torch rounds
three times); RMSNorm may differ in the last bit on a few elements per
million (the order of the float32 sum and the hardware ``rsqrt``).  float16 products in RoPE are
rounded once, not three times.  Only used on
CUDA; on CPU the eager path in :mod:`rlforge.rollout.native.model_runner` runs.  Tests run
these kernels on CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, stride_x, stride_r, stride_o, stride_s, eps,
    N: tl.constexpr, BLOCK: tl.constexpr, HAS_RES: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(res_ptr + row * stride_r + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # torch's rounded residual add
        tl.store(sum_ptr + row * stride_s + offs, x, mask=mask)
    h = x.to(tl.float32)
    var = tl.sum(h * h, 0) / N
    h = (h * tl.math.rsqrt(var + eps)).to(x.dtype)
    w = tl.load(w_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_o + offs, (w.to(tl.float32) * h.to(tl.float32)).to(out_ptr.dtype.element_ty),
             mask=mask)


def add_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim of ``x + residual`` (or of ``x`` when ``residual`` is None).

    ``x``, ``residual``: ``[..., N]`` in the compute dtype; ``weight``: ``[N]``.  Returns
    ``(normed, summed)``, both shaped like ``x``: ``normed = weight * rms_norm(summed)`` and
    ``summed = x + residual`` (``x`` itself when there is no residual).
    """
    shape = x.shape
    n = shape[-1]
    x2 = x.reshape(-1, n)
    out = torch.empty_like(x2, dtype=torch.promote_types(weight.dtype, x.dtype))
    if residual is not None:
        r2 = residual.reshape(-1, n)
        summed = torch.empty_like(x2)
    else:
        r2 = summed = x2
    rows = x2.shape[0]
    if rows:
        block = triton.next_power_of_2(n)
        _add_rms_norm_kernel[(rows,)](
            x2, r2, weight, out, summed, x2.stride(0), r2.stride(0), out.stride(0), summed.stride(0), float(eps),
            N=n, BLOCK=block, HAS_RES=residual is not None, num_warps=4 if block <= 2048 else 8,
        )
    return out.view(shape), summed.view(shape)


@triton.jit
def _rne_bf16(x):
    """float32 ``x`` rounded to bfloat16 precision (nearest, ties to even), kept in float32.
    Integer ops on the bits, so the compiler cannot drop the rounding: with ``.to(bf16).to(f32)``
    between a product and a sum, the H200 build rounded the RoPE result once instead of
    three times, unlike torch (18% of elements one or two ulps off, measured)."""
    b = x.to(tl.int32, bitcast=True)
    b = (b + 0x7FFF + ((b >> 16) & 1)) & -65536  # add half an ulp (ties to even), clear the low 16 bits
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _rot(x1, x2, c, s, PLUS: tl.constexpr, BF16: tl.constexpr):
    """``x1 * c - x2 * s`` (``+`` when ``PLUS``): one half of rotate-half RoPE, in float32, each
    product and the result rounded to bfloat16 precision when ``BF16``, as torch's three bf16
    ops round."""
    a = x1.to(tl.float32) * c
    b = x2.to(tl.float32) * s
    if BF16:
        a = _rne_bf16(a)
        b = _rne_bf16(b)
    r = a + b if PLUS else a - b
    if BF16:
        r = _rne_bf16(r)
    return r


@triton.jit
def _rope_and_cache_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, slot_ptr, qo_ptr, kc_ptr, vc_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ct,
    stride_qot, stride_qoh, stride_cs, stride_ch,
    H: tl.constexpr, KVH: tl.constexpr, H_PAD: tl.constexpr, KVH_PAD: tl.constexpr, HALF: tl.constexpr,
    BF16: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, HALF)
    c1 = tl.load(cos_ptr + t * stride_ct + d).to(tl.float32)
    c2 = tl.load(cos_ptr + t * stride_ct + HALF + d).to(tl.float32)
    s1 = tl.load(sin_ptr + t * stride_ct + d).to(tl.float32)
    s2 = tl.load(sin_ptr + t * stride_ct + HALF + d).to(tl.float32)
    # queries: out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)
    h = tl.arange(0, H_PAD)
    hm = (h < H)[:, None]
    qb = q_ptr + t * stride_qt + h[:, None] * stride_qh + d[None, :]
    q1 = tl.load(qb, mask=hm, other=0.0)
    q2 = tl.load(qb + HALF, mask=hm, other=0.0)
    dt = q1.dtype
    ob = qo_ptr + t * stride_qot + h[:, None] * stride_qoh + d[None, :]
    tl.store(ob, _rot(q1, q2, c1, s1, False, BF16).to(dt), mask=hm)
    tl.store(ob + HALF, _rot(q2, q1, c2, s2, True, BF16).to(dt), mask=hm)
    # keys (rotated) and values, straight into the token's cache slot
    slot = tl.load(slot_ptr + t).to(tl.int64)
    g = tl.arange(0, KVH_PAD)
    gm = (g < KVH)[:, None]
    kb = k_ptr + t * stride_kt + g[:, None] * stride_kh + d[None, :]
    k1 = tl.load(kb, mask=gm, other=0.0)
    k2 = tl.load(kb + HALF, mask=gm, other=0.0)
    cb = slot * stride_cs + g[:, None] * stride_ch + d[None, :]
    cdt = kc_ptr.dtype.element_ty
    tl.store(kc_ptr + cb, _rot(k1, k2, c1, s1, False, BF16).to(dt).to(cdt), mask=gm)
    tl.store(kc_ptr + cb + HALF, _rot(k2, k1, c2, s2, True, BF16).to(dt).to(cdt), mask=gm)
    vb = v_ptr + t * stride_vt + g[:, None] * stride_vh + d[None, :]
    tl.store(vc_ptr + cb, tl.load(vb, mask=gm, other=0.0).to(cdt), mask=gm)
    tl.store(vc_ptr + cb + HALF, tl.load(vb + HALF, mask=gm, other=0.0).to(cdt), mask=gm)


def rope_and_cache(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
    slot_mapping: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
) -> torch.Tensor:
    """Rotate-half RoPE of ``q`` and ``k`` and the store of the rotated K and of V in the cache.

    ``q: [T, H, D]``, ``k``, ``v``: ``[T, KVH, D]`` (last dim contiguous); ``cos``, ``sin``:
    ``[T, D]`` in the compute dtype (``cat(freqs, freqs)`` layout, attention scaling applied);
    ``slot_mapping: [T]`` int64 flat cache slots; ``k_cache``, ``v_cache``:
    ``[num_slots, KVH, D]`` views of one layer's cache (written in place).  Returns the rotated
    queries ``[T, H, D]``.  Raises ValueError for an odd head dimension or not a power of two.
    """
    t_, h_, d_ = q.shape
    kvh = k.shape[1]
    if d_ % 2 or (d_ // 2) & (d_ // 2 - 1):
        raise ValueError(f"rope_and_cache needs an even power-of-two head dimension, got {d_}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("rope_and_cache needs q, k and v with a contiguous last dimension")
    cos, sin = cos.contiguous(), sin.contiguous()
    q_out = torch.empty((t_, h_, d_), dtype=q.dtype, device=q.device)
    if t_:
        _rope_and_cache_kernel[(t_,)](
            q, k, v, cos, sin, slot_mapping, q_out, k_cache, v_cache,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos.stride(0),
            q_out.stride(0), q_out.stride(1), k_cache.stride(0), k_cache.stride(1),
            H=h_, KVH=kvh, H_PAD=triton.next_power_of_2(h_), KVH_PAD=triton.next_power_of_2(kvh), HALF=d_ // 2,
            BF16=q.dtype == torch.bfloat16, num_warps=4,
            enable_fp_fusion=False,  # float32: torch rounds the products before the sum, no FMA
        )
    return q_out


@triton.jit
def _silu_mul_kernel(g_ptr, u_ptr, o_ptr, stride_g, stride_u, stride_o, N, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    g = tl.load(g_ptr + row * stride_g + offs, mask=mask, other=0.0)
    u = tl.load(u_ptr + row * stride_u + offs, mask=mask, other=0.0)
    gf = g.to(tl.float32)
    a = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # F.silu, rounded to the compute dtype
    tl.store(o_ptr + row * stride_o + offs, (a.to(tl.float32) * u.to(tl.float32)).to(g.dtype), mask=mask)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate``, ``up``: ``[T, N]`` (last dim contiguous) -> ``[T, N]``."""
    t_, n = gate.shape
    out = torch.empty((t_, n), dtype=gate.dtype, device=gate.device)
    if t_:
        block = min(4096, triton.next_power_of_2(n))
        _silu_mul_kernel[(t_, triton.cdiv(n, block))](gate, up, out, gate.stride(0), up.stride(0), out.stride(0), n,
                                                      BLOCK=block, num_warps=4)
    return out

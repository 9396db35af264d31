"""Decode-size GEMMs with the decoder layer's elementwise work fused into them (Triton).

At decode batch sizes (``M`` <= :data:`MAX_ROWS` rows) a layer's GEMMs read megabytes of
weights for a few rows, and every separate kernel between them (the residual add and RMSNorm,
SiLU·mul, cuBLAS's split-K reduction) costs about 2 µs however little it moves: the 0.5B decode
step at batch 16 x 8k ran ~286 kernels in 1,610 µs against a 541 µs bandwidth floor
(``benchmarks/RESULTS.md``, "Where a decode step's time goes").  :func:`skinny_linear` computes
``y = f(x) @ W.T + b`` in one launch, where ``f`` is one of

- nothing;
- RMSNorm: ``weight * rms_norm(x)``, with the row statistics either computed here (a first pass
  over ``x``) or summed from the per-tile partial sums of squares that the previous
  :func:`skinny_linear` wrote in its epilogue (``Rows.ss``);
- SiLU·mul of a packed ``[gate | up]`` input (``silu(x[:, :K]) * x[:, K:2K]``);

and, optionally, adds the residual in the epilogue: it then returns ``Rows(h = residual + y,
ss = per-tile sums of squares of h)`` for the next layer's RMSNorm instead of ``y``.  So a
decoder layer is six launches (QKV with its RMSNorm; RoPE + KV write; attention; O with the
residual; gate/up with its RMSNorm; down with SiLU·mul and the residual) instead of ~12.

Split-K: a program computes ``BLOCK_N`` outputs over ``K / SPLIT_K`` of the reduction, writes
its float32 partial tile, and the last program of each output tile to arrive (an atomic counter
per tile, reset by that program) sums the ``SPLIT_K`` partials in a fixed order and runs the
epilogue, so results do not depend on arrival order (deterministic, unlike atomic adds).

Numerics follow the eager path (:mod:`.triton_fused`, transformers' ``modeling_llama.py``): the
residual sum, the normalised rows, the norm-weight product, ``silu`` and its product with ``up``
are rounded to the compute dtype where torch rounds them; the GEMM accumulates in float32 and
adds the bias before its one rounding (as cuBLAS's bias epilogue).  What differs is the order of
float32 sums (the dot products, and the row's sum of squares taken as a sum of per-tile sums).
Only used on CUDA; tests run it on CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from rlforge.rollout.native.model_runner import Rows

MAX_ROWS = 32
"""Largest ``M`` this kernel takes (one ``BLOCK_M`` tile of rows); larger batches use cuBLAS (at 64 rows the
kernel ran its GEMMs at a third of cuBLAS's speed, ``benchmarks/RESULTS.md`` of 2026-12-02)."""

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_NONE, _NORM_STATS, _NORM_PARTIAL, _SILU = 0, 1, 2, 3


@dataclass(frozen=True)
class SkinnyConfig:
    """Launch settings (they change the speed, not the result beyond float32 sum order)."""

    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _epilogue(acc, bias, r, rm, rn, mmask, nmask, y_ptr, h_ptr, sso_ptr, pid_n, M, stride_ym, stride_hm,
              HAS_BIAS: tl.constexpr, EPI_RES: tl.constexpr):
    mn = mmask[:, None] & nmask[None, :]
    if HAS_BIAS:
        acc += bias[None, :]
    if EPI_RES:
        y = acc.to(h_ptr.dtype.element_ty)  # the GEMM output, rounded, then torch's rounded residual add
        h = (y.to(tl.float32) + r.to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + rm[:, None] * stride_hm + rn[None, :], h, mask=mn)
        hf = tl.where(mn, h.to(tl.float32), 0.0)
        tl.store(sso_ptr + pid_n * M + rm, tl.sum(hf * hf, 1), mask=mmask)
    else:
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=mn)


@triton.jit
def _load_x(x_ptr, rm, mmask, rk, kmask, stride_xm, up_off, PRO: tl.constexpr):
    """The input rows' columns ``rk`` (and, for SiLU·mul, the matching ``up`` columns)."""
    xm = mmask[:, None] & kmask[None, :]
    x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=xm, other=0.0)
    u = x
    if PRO == 3:
        u = tl.load(x_ptr + rm[:, None] * stride_xm + up_off + rk[None, :], mask=xm, other=0.0)
    return x, u


@triton.jit
def _a_tile(x, u, nw_ptr, w_ptr, rk, kmask, inv, PRO: tl.constexpr):
    """The GEMM's left operand for columns ``rk``: ``f(x)`` in the weight dtype."""
    xdt = x.dtype
    wdt = w_ptr.dtype.element_ty
    if PRO == 1 or PRO == 2:
        nrm = (x.to(tl.float32) * inv[:, None]).to(xdt)
        nw = tl.load(nw_ptr + rk, mask=kmask, other=0.0).to(tl.float32)
        a = (nw[None, :] * nrm.to(tl.float32)).to(wdt)
    elif PRO == 3:
        gf = x.to(tl.float32)
        s = (gf / (1.0 + tl.exp(-gf))).to(xdt)  # F.silu, rounded
        a = (s.to(tl.float32) * u.to(tl.float32)).to(xdt).to(wdt)
    else:
        a = x.to(wdt)
    return a


@triton.jit
def _dot(a, w, IEEE: tl.constexpr):
    if IEEE:  # float32 operands (or the CPU interpreter, whose bf16 dot is wrong): exact float32 products
        return tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), input_precision="ieee")
    return tl.dot(a, tl.trans(w))


@triton.jit
def _skinny_kernel(
    x_ptr, nw_ptr, ssi_ptr, w_ptr, b_ptr, r_ptr, y_ptr, h_ptr, sso_ptr, part_ptr, cnt_ptr,
    M, N, stride_xm, stride_wn, stride_rm, stride_ym, stride_hm, eps, up_off, n_ss,
    K: tl.constexpr, PRO: tl.constexpr, HAS_BIAS: tl.constexpr, EPI_RES: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
    K_SPLIT: tl.constexpr, SS_PAD: tl.constexpr, USE_GDC: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    mmask = rm < M
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = rn < N
    k_lo = pid_k * K_SPLIT
    # what no earlier kernel writes (the first weight tile, the bias) is read before waiting for them
    rk = k_lo + tl.arange(0, BLOCK_K)
    kmask = rk < K
    w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
    bias = tl.zeros([BLOCK_N], dtype=tl.float32)
    if HAS_BIAS:
        bias = tl.load(b_ptr + rn, mask=nmask, other=0.0).to(tl.float32)
    if USE_GDC:  # programmatic dependent launch: the previous kernel's outputs (x, the residual, the row
        # statistics) are complete after the wait; then the next kernel may start and fetch its own weights
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x, u = _load_x(x_ptr, rm, mmask, rk, kmask, stride_xm, up_off, PRO)  # issued with the loads below
    r = tl.zeros([BLOCK_M, BLOCK_N], dtype=r_ptr.dtype.element_ty)
    if EPI_RES:
        r = tl.load(r_ptr + rm[:, None] * stride_rm + rn[None, :], mask=mmask[:, None] & nmask[None, :], other=0.0)
    inv = tl.zeros([BLOCK_M], dtype=tl.float32)
    if PRO == 1:  # row statistics from x itself
        ss = tl.zeros([BLOCK_M], dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            rs = k0 + tl.arange(0, BLOCK_K)
            xs = tl.load(x_ptr + rm[:, None] * stride_xm + rs[None, :], mask=mmask[:, None] & (rs < K)[None, :],
                         other=0.0).to(tl.float32)
            ss += tl.sum(xs * xs, 1)
        inv = tl.math.rsqrt(ss / K + eps)
    if PRO == 2:  # row statistics from the producer's per-tile partial sums
        j = tl.arange(0, SS_PAD)
        parts = tl.load(ssi_ptr + j[:, None] * M + rm[None, :], mask=(j < n_ss)[:, None] & mmask[None, :], other=0.0)
        inv = tl.math.rsqrt(tl.sum(parts, 0) / K + eps)
    acc = _dot(_a_tile(x, u, nw_ptr, w_ptr, rk, kmask, inv, PRO), w, IEEE)
    for k0 in range(BLOCK_K, K_SPLIT, BLOCK_K):  # K_SPLIT is a multiple of BLOCK_K: splits never overlap
        rk = k_lo + k0 + tl.arange(0, BLOCK_K)
        kmask = rk < K
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
        x, u = _load_x(x_ptr, rm, mmask, rk, kmask, stride_xm, up_off, PRO)
        acc += _dot(_a_tile(x, u, nw_ptr, w_ptr, rk, kmask, inv, PRO), w, IEEE)
    if SPLIT_K == 1:
        _epilogue(acc, bias, r, rm, rn, mmask, nmask, y_ptr, h_ptr, sso_ptr, pid_n, M, stride_ym, stride_hm,
                  HAS_BIAS, EPI_RES)
    else:
        mn = mmask[:, None] & nmask[None, :]
        tl.store(part_ptr + (pid_k * M + rm[:, None]) * N + rn[None, :], acc, mask=mn)
        tl.debug_barrier()  # every thread's partial is written before the counter says so
        arrived = tl.atomic_add(cnt_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
        if arrived == SPLIT_K - 1:  # the last split of this tile: sum the partials in split order
            tot = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                tot += tl.load(part_ptr + (s * M + rm[:, None]) * N + rn[None, :], mask=mn, other=0.0,
                               cache_modifier=".cg")
            _epilogue(tot, bias, r, rm, rn, mmask, nmask, y_ptr, h_ptr, sso_ptr, pid_n, M, stride_ym, stride_hm,
                      HAS_BIAS, EPI_RES)
            tl.atomic_xchg(cnt_ptr + pid_n, 0, sem="relaxed", scope="gpu")  # ready for the next launch


_COUNTERS: dict[torch.device, torch.Tensor] = {}
_COUNTER_SLOTS = 1 << 16


def _counters(device: torch.device, n: int) -> torch.Tensor:
    """``n`` zeroed int32 tile counters on ``device``, shared by every launch (each launch's last
    programs reset theirs to 0, and launches on one stream do not overlap).  Allocated once, at
    the first (warm-up) call, so a captured graph does not re-zero them."""
    key = torch.device(device.type, device.index if device.index is not None or device.type != "cuda"
                       else torch.cuda.current_device())
    buf = _COUNTERS.get(key)
    if buf is None:
        buf = _COUNTERS[key] = torch.zeros(_COUNTER_SLOTS, dtype=torch.int32, device=key)
    if n > _COUNTER_SLOTS:
        raise ValueError(f"skinny_linear needs {n} tile counters, more than {_COUNTER_SLOTS}")
    return buf


@functools.cache
def _num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def default_config(m: int, n: int, k: int, device: torch.device) -> SkinnyConfig:
    """The launch settings :func:`skinny_linear` uses for an ``[m, k] x [k, n]`` product: 32
    outputs per program (128 for an LM head's vocabulary), and the reduction split so that
    about two programs run per SM, at least one 128-wide step per split (the fastest settings
    of ``benchmarks/skinny_gemm.py --sweep`` at M = 16 on an H200, 2026-12-02)."""
    block_n, block_k = (32, 128) if n <= 16384 else (128, 128)
    tiles = triton.cdiv(n, block_n)
    steps = triton.cdiv(k, block_k)
    split = max(1, min(steps, round(2 * _num_sms(device) / tiles)))
    return SkinnyConfig(block_n, block_k, split, 4, 4 if split == 1 else 3)


@functools.cache
def pdl_supported(device: torch.device) -> bool:
    """Whether ``device`` runs programmatic dependent launch (CUDA compute capability 9.0 and later)."""
    return device.type == "cuda" and not _INTERPRET and torch.cuda.get_device_capability(device)[0] >= 9


def skinny_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
    norm_weight: torch.Tensor | None = None, eps: float = 1e-6, norm_ss: torch.Tensor | None = None,
    silu: bool = False, residual: torch.Tensor | None = None, config: SkinnyConfig | None = None,
    pdl: bool = False,
) -> torch.Tensor | Rows:
    """``f(x) @ weight.T + bias`` for ``M <= MAX_ROWS`` rows, with ``f`` and the residual fused.

    Args:
        x: ``[M, K]`` rows in the compute dtype (``[M, 2K]``, ``[gate | up]``, with ``silu``),
            unit stride in the last dim.
        weight: ``[N, K]``, contiguous rows; bias: ``[N]`` or None.
        norm_weight: ``[K]``: ``f`` is RMSNorm with this weight and ``eps``; its row statistics
            come from ``norm_ss`` (``[tiles, M]`` float32 partial sums of squares of ``x``, a
            :class:`Rows`' ``ss``) or, when None, from ``x`` itself.
        silu: ``f(x) = silu(x[:, :K]) * x[:, K:]`` (not with ``norm_weight``).
        residual: ``[M, N]``: return ``Rows(residual + y, ss)`` instead of ``y``.
        config: launch settings (None: :func:`default_config`).
        pdl: launch with programmatic dependent launch (Hopper and later, see
            :func:`pdl_supported`): the kernel lets the next launch start at once and fetches
            its first weight tile and bias before it waits for the previous kernel's outputs.

    Returns ``y: [M, N]`` in ``x``'s dtype, or :class:`Rows` with ``residual``.  Raises
    ValueError for more than :data:`MAX_ROWS` rows, both ``norm_weight`` and ``silu``, or
    shapes that do not match.
    """
    m = x.shape[0]
    n, k = weight.shape
    if m > MAX_ROWS:
        raise ValueError(f"skinny_linear takes at most {MAX_ROWS} rows, got {m}")
    if norm_weight is not None and silu:
        raise ValueError("skinny_linear: norm_weight and silu cannot both be set")
    if x.shape[1] != (2 * k if silu else k) or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError(f"skinny_linear: x {tuple(x.shape)} does not match weight {tuple(weight.shape)}"
                         f"{' (silu: x is [M, 2K])' if silu else ''}, or a last dim is not contiguous")
    if residual is not None and tuple(residual.shape) != (m, n):
        raise ValueError(f"skinny_linear: residual {tuple(residual.shape)} is not [{m}, {n}]")
    cfg = config or default_config(m, n, k, x.device)
    tiles = triton.cdiv(n, cfg.block_n)
    k_split = triton.cdiv(triton.cdiv(k, cfg.split_k), cfg.block_k) * cfg.block_k
    split = triton.cdiv(k, k_split)
    dev = x.device
    out_dtype = x.dtype
    y = h = sso = None
    if residual is not None:
        h = torch.empty((m, n), dtype=out_dtype, device=dev)
        sso = torch.empty((tiles, m), dtype=torch.float32, device=dev)
    else:
        y = torch.empty((m, n), dtype=out_dtype, device=dev)
    if m == 0:
        return y if residual is None else Rows(h, sso)
    pro = _NONE
    if norm_weight is not None:
        pro = _NORM_PARTIAL if norm_ss is not None else _NORM_STATS
    elif silu:
        pro = _SILU
    part = torch.empty((split, m, n), dtype=torch.float32, device=dev) if split > 1 else y if y is not None else h
    cnt = _counters(dev, tiles) if split > 1 else part
    n_ss = norm_ss.shape[0] if norm_ss is not None else 1
    any_t = y if y is not None else h
    _skinny_kernel[(tiles, split)](
        x, norm_weight if norm_weight is not None else x, norm_ss if norm_ss is not None else x, weight,
        bias if bias is not None else weight, residual if residual is not None else any_t, any_t, any_t,
        sso if sso is not None else any_t, part, cnt,
        m, n, x.stride(0), weight.stride(0), residual.stride(0) if residual is not None else 0, any_t.stride(0),
        any_t.stride(0), float(eps), k, n_ss,
        USE_GDC=pdl, K=k, PRO=pro, HAS_BIAS=bias is not None, EPI_RES=residual is not None, IEEE=weight.dtype == torch.float32 or _INTERPRET,
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, SPLIT_K=split,
        K_SPLIT=k_split, SS_PAD=max(2, triton.next_power_of_2(n_ss)),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages, **({"launch_pdl": True} if pdl else {}),
    )
    return y if residual is None else Rows(h, sso)

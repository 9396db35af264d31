"""Triton kernels for the chunked LM head's per-row statistics and logit gradient
(``actor_rollout_ref.model.fused_kernel_options.impl_backend=triton``, CUDA only).

:class:`rlforge.roles.fused_head.ChunkedLinearLogProbs` computes a chunk's logits
``z = h @ W.T`` with one GEMM (``(chunk, vocab)`` in the compute dtype, bf16 under FSDP mixed
precision).  The torch path then runs five to eight float32 passes over that chunk: the cast,
``logsumexp`` (max, subtract, exp, sum), ``gather``, for the entropy a softmax, a product and a sum;
in backward the cast, subtract, exp, multiply, scatter and the cast back.  Each pass over a
2048 x 151,936 float32 chunk moves 1.2 GB.  Here one program per row walks the vocabulary in tiles:

- :func:`row_stats`: one read of ``z``; an online log-sum-exp (running max ``m`` and rescaled
  sums ``s = sum exp(x - m)`` and ``t = sum exp(x - m) * x``, as in FlashAttention's softmax) of
  ``x = z / T`` gives ``logsumexp(x) = m + log s``, the target's ``x_y`` and the entropy
  ``H = logsumexp(x) - t / s`` (``E_p[x] = t / s``);
- :func:`logit_grad_`: one read and one write of ``z``, in place:
  ``dL/dz_v = (g_logp * (1[v = y] - p_v) + g_H * p_v * (E_p[x] - x_v)) / T`` with
  ``p_v = exp(x_v - logsumexp(x))``, the same formula as the torch path, computed in float32 and
  rounded to ``z``'s dtype once (the torch path rounds its float32 gradient to the compute dtype
  before the two backward GEMMs too).

Bytes per logit: 2 (forward) + 4 (backward) for bf16, against about 20 + 38 for the torch path.
Statistics are float32.  Only imported where CUDA and Triton are present; the torch path of
:mod:`rlforge.roles.fused_head` is the CPU path and the reference (tests/roles/test_fused_head_cuda.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
"""Vocabulary elements per tile (one program per row walks ``ceil(V / BLOCK)`` tiles)."""


@triton.jit
def _row_stats_kernel(z_ptr, stride, tgt_ptr, lse_ptr, zy_ptr, ent_ptr, temp,
                      VOCAB: tl.constexpr, WITH_ENT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = z_ptr + row.to(tl.int64) * stride
    m = tl.full((), float("-inf"), tl.float32)
    s = tl.zeros((), tl.float32)
    t = tl.zeros((), tl.float32)
    for start in range(0, VOCAB, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        valid = offs < VOCAB
        x = tl.load(base + offs, mask=valid, other=float("-inf")).to(tl.float32) / temp
        new_m = tl.maximum(m, tl.max(x, 0))
        scale = tl.where(m == float("-inf"), 0.0, tl.exp(m - new_m))
        e = tl.where(valid, tl.exp(x - new_m), 0.0)
        s = s * scale + tl.sum(e, 0)
        if WITH_ENT:
            t = t * scale + tl.sum(tl.where(valid, e * x, 0.0), 0)
        m = new_m
    lse = m + tl.log(s)
    y = tl.load(tgt_ptr + row)
    zy = tl.load(base + y).to(tl.float32) / temp
    tl.store(lse_ptr + row, lse)
    tl.store(zy_ptr + row, zy)
    if WITH_ENT:
        tl.store(ent_ptr + row, lse - t / s)


@triton.jit
def _logit_grad_kernel(z_ptr, stride, tgt_ptr, lse_ptr, ent_ptr, glogp_ptr, gent_ptr, temp,
                       VOCAB: tl.constexpr, WITH_ENT: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    base = z_ptr + row.to(tl.int64) * stride
    lse = tl.load(lse_ptr + row)
    g_logp = tl.load(glogp_ptr + row)
    y = tl.load(tgt_ptr + row)
    if WITH_ENT:
        g_ent = tl.load(gent_ptr + row)
        mean_x = lse - tl.load(ent_ptr + row)  # E_p[x] = logsumexp(x) - H
    for start in range(0, VOCAB, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        valid = offs < VOCAB
        zv = tl.load(base + offs, mask=valid, other=0.0)
        x = zv.to(tl.float32) / temp
        p = tl.exp(x - lse)
        g = tl.where(offs == y, g_logp, 0.0) - g_logp * p
        if WITH_ENT:
            g += g_ent * p * (mean_x - x)
        g = g / temp
        tl.store(base + offs, g.to(zv.dtype), mask=valid)


def _check(z: torch.Tensor, targets: torch.Tensor) -> None:
    if not (z.is_cuda and z.dim() == 2 and z.stride(1) == 1):
        raise ValueError(f"row_stats/logit_grad_: z must be a row-contiguous (rows, vocab) CUDA tensor, got "
                         f"shape {tuple(z.shape)}, strides {z.stride()} on {z.device}")
    if targets.shape != (z.shape[0],):
        raise ValueError(f"targets has shape {tuple(targets.shape)}, expected ({z.shape[0]},)")


def row_stats(z: torch.Tensor, targets: torch.Tensor, temperature: float,
              with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """``(logsumexp(x), x_y, H)`` of ``x = z / temperature`` for each row of ``z``.

    Args:
        z: ``(rows, vocab)`` logits on CUDA (bf16, fp16 or fp32), rows contiguous; not changed.
        targets: ``(rows,)`` int64 token ids in ``[0, vocab)`` (not checked on the device).
        temperature: > 0.
        with_entropy: also return the entropy ``H`` (nats), else None.
    Returns:
        three ``(rows,)`` float32 tensors (the last None without ``with_entropy``).
    Raises:
        ValueError: ``z`` not a row-contiguous 2-D CUDA tensor, or ``targets`` of another length.
    """
    _check(z, targets)
    targets = targets.contiguous()
    rows, vocab = z.shape
    f32 = dict(dtype=torch.float32, device=z.device)
    lse, zy = torch.empty(rows, **f32), torch.empty(rows, **f32)
    ent = torch.empty(rows if with_entropy else 1, **f32)
    if rows:
        _row_stats_kernel[(rows,)](z, z.stride(0), targets, lse, zy, ent, float(temperature),
                                   VOCAB=vocab, WITH_ENT=with_entropy, BLOCK=BLOCK, num_warps=8)
    return lse, zy, (ent if with_entropy else None)


def logit_grad_(z: torch.Tensor, targets: torch.Tensor, lse: torch.Tensor, g_logp: torch.Tensor,
                temperature: float, ent: torch.Tensor | None = None, g_ent: torch.Tensor | None = None) -> torch.Tensor:
    """Overwrite ``z`` with ``dL/dz`` (module docstring) and return it.

    Args:
        z: ``(rows, vocab)`` logits on CUDA, rows contiguous, as :func:`row_stats` read them.
        targets, lse, g_logp: ``(rows,)``; ``lse`` from :func:`row_stats`, ``g_logp`` the
            gradient reaching the log-probs (float32).
        ent, g_ent: ``(rows,)`` entropy and its gradient, both or neither.
    Raises:
        ValueError: as :func:`row_stats`, or only one of ``ent``/``g_ent`` given.
    """
    _check(z, targets)
    if (ent is None) != (g_ent is None):
        raise ValueError("logit_grad_: pass both ent and g_ent, or neither")
    targets = targets.contiguous()
    rows, vocab = z.shape
    with_ent = ent is not None
    if rows:
        _logit_grad_kernel[(rows,)](z, z.stride(0), targets, lse.float().contiguous(),
                                    ent.float().contiguous() if with_ent else lse,
                                    g_logp.float().contiguous(),
                                    g_ent.float().contiguous() if with_ent else lse, float(temperature),
                                    VOCAB=vocab, WITH_ENT=with_ent, BLOCK=BLOCK, num_warps=8)
    return z

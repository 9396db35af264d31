"""Log-probs and entropy from the LM head, chunk by chunk (``actor_rollout_ref.model.use_fused_kernels``).

The plain forward lets the model compute ``logits (batch, seq, vocab)`` for every position,
prompt included, then a float32 copy, log-softmax and entropy intermediates and their
gradients.  With Qwen2.5's 151,936-word vocabulary a 16k-token micro-batch makes ~10 GB per
float32 ``(seq, vocab)`` tensor, and the passes over them are memory-bound.  Here instead:

1. the model runs without its head: ``logits_to_keep`` selects no position and
   ``output_hidden_states`` gives the final-norm output ``hidden_states[-1]``
   (:func:`last_hidden_states`; the model's own ``forward``, so FSDP hooks run as usual);
2. the caller keeps only the hidden states ``(M, hidden)`` of the positions that predict
   response tokens;
3. :class:`ChunkedLinearLogProbs` computes, ``chunk_size`` positions at a time,

       z = (h @ W.T + b) / T,   log p(y) = z_y - logsumexp(z),   H = logsumexp(z) - sum_v softmax(z)_v z_v

   keeping only ``logsumexp`` and ``H`` per position; backward recomputes each chunk's
   logits and forms the logit gradient in place:

       dL/dz_v = g_logp * (1[v = y] - p_v) + g_H * p_v * (E_p[z] - z_v),   E_p[z] = logsumexp(z) - H

   then ``dL/dh = (dL/dz / T) @ W`` and ``dL/dW += (dL/dz / T).T @ h``.  Only one chunk's
   ``(chunk_size, vocab)`` buffers are alive at a time (about three float32 ones at the peak:
   the logits, the softmax and its product with the logits in forward), in forward and in
   backward; between forward and backward only ``logsumexp`` and ``H`` per position are kept.

Numerics (the same choices as the plain path, which runs ``lm_head`` then ``.float()``):
the matmuls run in the compute dtype (the autocast dtype when autocast is on; else the
weight's dtype, e.g. bf16 under FSDP mixed precision); softmax statistics, log-probs, entropy and the logit gradient
are float32; the logit gradient is cast to the compute dtype for the two backward matmuls
(as autograd's ``.float()`` backward does).  The weight gradient is accumulated over chunks
in float32 and cast to the weight's dtype once (the plain path rounds one matmul's result to
the compute dtype).  In float32 the result equals the plain path's to rounding.

Tied embeddings need nothing special: ``lm_head.weight`` *is* ``embed_tokens.weight``, so
the weight gradient returned here accumulates into the same parameter as the embedding's.

FSDP: the head's weight is read after the model's forward returned.  Under FSDP2 the root
unit (embeddings, final norm, head) is not resharded after forward (FSDP2's default for the
root, kept by :func:`rlforge.engine.fsdp2.parallelize_fsdp2`), so the weight is the unsharded
parameter whose gradient FSDP2 reduce-scatters after backward.  FSDP1 (``use_orig_params``)
turns the root's parameters back into flat shards after forward, so it cannot be used here
(``TrainEngine.head_readable_after_forward`` is False; the trainer falls back to the full
logits).  A sharded weight raises instead of computing something wrong.

Backends (``fused_kernel_options.impl_backend``, one setting per process, :func:`set_impl_backend`):
``triton`` (the default) runs each chunk's statistics and logit gradient as one Triton kernel each
(:mod:`rlforge.roles.triton_head`: one read of the chunk's logits in forward, one read and one write in
backward, in the compute dtype) where the logits are on CUDA, in bf16, fp16 or fp32, and Triton imports;
the plain-torch chunks above everywhere else (the CPU, float64 models) and with ``impl_backend=torch``.
Both use the same formulas, with float32 statistics; they agree to float32 rounding.

Source: the same computation as verl's ``FusedLinearForPPO`` (torch backend,
``verl/utils/experimental/torch_functional.py``) and Liger's fused linear cross-entropy, in
plain torch.  Deviation: verl patches the model's ``forward``; rlforge calls the model's own
forward and selects only the response positions before the head.
"""

from __future__ import annotations

import contextlib
import functools
import math
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from rlforge.models.log_z import PolicyWithLogZ

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral")
"""``config.model_type`` values whose logits are exactly ``lm_head(final hidden state)`` (no
soft-capping or logit scaling), so the chunked head reproduces them."""


IMPL_BACKENDS = ("torch", "triton")
_impl_backend = "triton"


def set_impl_backend(name: str) -> None:
    """Choose the chunk kernels for this process (``actor_rollout_ref.model.fused_kernel_options.impl_backend``).

    Raises:
        ValueError: ``name`` not in :data:`IMPL_BACKENDS`.
    """
    global _impl_backend
    if name not in IMPL_BACKENDS:
        raise ValueError(f"actor_rollout_ref.model.fused_kernel_options.impl_backend={name!r}: "
                         f"must be one of {', '.join(IMPL_BACKENDS)}")
    _impl_backend = name


def impl_backend() -> str:
    """The backend :func:`set_impl_backend` chose (``triton`` unless told otherwise)."""
    return _impl_backend


@functools.cache
def _triton_head() -> Any:
    try:
        from rlforge.roles import triton_head
    except ImportError:  # no Triton (a CPU-only torch)
        return None
    return triton_head


def _triton_for(t: torch.Tensor, backend: str) -> Any:
    """The Triton kernels' module when ``backend`` is ``triton`` and ``t`` (the chunk inputs) qualifies, else None."""
    if backend != "triton" or not t.is_cuda or t.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None
    return _triton_head()


def _lm(module: nn.Module) -> nn.Module:
    return module.lm if isinstance(module, PolicyWithLogZ) else module


def output_head(module: nn.Module) -> nn.Module:
    """The LM head of a causal LM (or of the LM inside a :class:`PolicyWithLogZ`)."""
    return _lm(module).get_output_embeddings()


def fused_head_unsupported(module: nn.Module) -> str | None:
    """Why the chunked head cannot stand in for ``module``'s logits, or None when it can."""
    lm = _lm(module)
    model_type = getattr(getattr(lm, "config", None), "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (f"model_type={model_type!r} is not one whose logits are exactly lm_head(hidden) "
                f"({', '.join(SUPPORTED_MODEL_TYPES)})")
    if not isinstance(output_head(module), nn.Linear):
        return f"its output embedding is a {type(output_head(module)).__name__}, not an nn.Linear"
    return None


@contextlib.contextmanager
def fsdp2_view_outputs_ok() -> Iterator[None]:
    """Silence FSDP2's warning that the root module returned a view tensor (the embedding output among the
    hidden states, a value model's logits): rlforge's forwards never write into a model output in place,
    which is the case the warning is about."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        yield


def last_hidden_states(module: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       position_ids: torch.Tensor, **attn_kwargs: Any) -> torch.Tensor:
    """The final-norm hidden states ``(batch, seq, hidden)`` of a causal LM, computed by the
    model's own ``forward`` with no logits (``logits_to_keep`` selects no position).
    ``attn_kwargs`` go to the model unchanged (e.g. the varlen ``cu_seq_lens_q/k``)."""
    none = torch.empty(0, dtype=torch.long, device=input_ids.device)
    with fsdp2_view_outputs_ok():  # hidden_states[0], the embedding output, is a view
        out = module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                     output_hidden_states=True, logits_to_keep=none, **attn_kwargs)
    return out.hidden_states[-1]


def _compute_dtype(hidden: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    dev = hidden.device.type
    if torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return weight.dtype


def _stats_dtype(compute_dtype: torch.dtype) -> torch.dtype:
    """float32, or float64 for a float64 model (gradient checks)."""
    return torch.promote_types(compute_dtype, torch.float32)


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """``(h @ w.T + b).float() / T``: ``(chunk, vocab)`` float32 (float64 for float64 inputs), a fresh tensor."""
    z = torch.mm(h, w.t()) if b is None else torch.addmm(b, h, w.t())
    z = z.to(_stats_dtype(z.dtype))
    if temperature != 1.0:
        z = z.div_(temperature)
    return z


def _logit_grad(z: torch.Tensor, lse: torch.Tensor, ent: torch.Tensor | None, targets: torch.Tensor,
                g_logp: torch.Tensor, g_ent: torch.Tensor | None, temperature: float) -> torch.Tensor:
    """``dL/d(h @ W.T + b)`` for one chunk (see the module docstring), overwriting ``z``."""
    if g_ent is not None and ent is not None:
        coef = g_ent * (lse - ent) - g_logp  # per row: g_H * E_p[z] - g_logp
        p = (z - lse[:, None]).exp_()
        gz = z.mul_(-g_ent[:, None]).add_(coef[:, None]).mul_(p)
        del p
    else:
        gz = z.sub_(lse[:, None]).exp_().mul_(-g_logp[:, None])
    gz.scatter_add_(1, targets[:, None], g_logp[:, None])
    if temperature != 1.0:
        gz.div_(temperature)
    return gz


def _accumulate_mm(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``acc += a @ b`` with ``acc`` float32; bf16/fp16 inputs accumulate in float32 without
    rounding the product (CUDA ``out_dtype``), else through a product in the inputs' dtype."""
    if a.dtype == acc.dtype:
        acc.addmm_(a, b)
    elif acc.is_cuda:
        torch.addmm(acc, a, b, out_dtype=acc.dtype, out=acc)
    else:
        acc.add_(torch.mm(a, b))


class ChunkedLinearLogProbs(torch.autograd.Function):
    """``(log p(targets), entropy)`` of ``softmax((hidden @ weight.T + bias) / T)``, chunked.

    Inputs: ``hidden (M, H)``, ``weight (V, H)``, ``bias (V,)`` or None, ``targets (M,)`` int64,
    ``temperature`` > 0, ``chunk_size`` >= 1 positions, ``with_entropy``.  Outputs: log-probs
    ``(M,)`` float32 nats and entropy ``(M,)`` float32 (an empty tensor without ``with_entropy``);
    float64 for float64 inputs.
    Differentiable in ``hidden``, ``weight`` and ``bias`` through both outputs.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, chunk_size, with_entropy,  # noqa: ANN001, ANN205
                backend="torch"):
        cdt = _compute_dtype(hidden, weight)
        with torch.autocast(hidden.device.type, enabled=False):
            h, w = hidden.to(cdt), weight.to(cdt)
            b = bias.to(cdt) if bias is not None else None
            m = h.shape[0]
            f32 = dict(dtype=_stats_dtype(cdt), device=h.device)
            logp, lse = torch.empty(m, **f32), torch.empty(m, **f32)
            ent = torch.empty(m if with_entropy else 0, **f32)
            tk = _triton_for(h, backend)
            for s in range(0, m, chunk_size):
                e = min(m, s + chunk_size)
                if tk is not None:
                    z = torch.mm(h[s:e], w.t()) if b is None else torch.addmm(b, h[s:e], w.t())
                    lse_c, zy, ent_c = tk.row_stats(z, targets[s:e], temperature, with_entropy)
                    logp[s:e] = zy - lse_c
                    lse[s:e] = lse_c
                    if with_entropy:
                        ent[s:e] = ent_c
                    del z
                    continue
                z = _chunk_logits(h[s:e], w, b, temperature)
                lse_c = torch.logsumexp(z, dim=-1)
                logp[s:e] = z.gather(1, targets[s:e, None])[:, 0] - lse_c
                lse[s:e] = lse_c
                if with_entropy:
                    ent[s:e] = lse_c - (torch.softmax(z, dim=-1) * z).sum(-1)
                del z
        ctx.save_for_backward(h, w, b, targets, lse, ent)
        ctx.set_materialize_grads(False)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        ctx.triton = tk is not None
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        if not with_entropy:
            ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):  # noqa: ANN001, ANN205
        h, w, b, targets, lse, ent = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        if g_logp is None and g_ent is None:
            return (None,) * 8
        m, T = h.shape[0], ctx.temperature
        if g_logp is None:
            g_logp = torch.zeros_like(lse)
        if not ctx.with_entropy:
            g_ent = None
        grad_h = torch.empty_like(h) if need_h else None
        acc = dict(dtype=lse.dtype, device=w.device)  # float32 (float64 for a float64 model)
        grad_w = torch.zeros(w.shape, **acc) if need_w else None
        grad_b = torch.zeros(w.shape[0], **acc) if need_b and b is not None else None
        with torch.autocast(h.device.type, enabled=False):
            tk = _triton_head() if ctx.triton else None
            with_ent = g_ent is not None
            for s in range(0, m, ctx.chunk_size):
                e = min(m, s + ctx.chunk_size)
                if tk is not None:
                    z = torch.mm(h[s:e], w.t()) if b is None else torch.addmm(b, h[s:e], w.t())
                    gz = tk.logit_grad_(z, targets[s:e], lse[s:e], g_logp[s:e], T,
                                        ent[s:e] if with_ent else None, g_ent[s:e] if with_ent else None)
                    if grad_b is not None:
                        grad_b += gz.sum(0, dtype=grad_b.dtype)
                else:
                    z = _chunk_logits(h[s:e], w, b, T)
                    gz = _logit_grad(z, lse[s:e], ent[s:e] if with_ent else None, targets[s:e],
                                     g_logp[s:e], g_ent[s:e] if with_ent else None, T)
                    if grad_b is not None:
                        grad_b += gz.sum(0)
                gz = gz.to(h.dtype)
                if grad_h is not None:
                    torch.mm(gz, w, out=grad_h[s:e])
                if grad_w is not None:
                    _accumulate_mm(grad_w, gz.t(), h[s:e])
                del gz, z
        h_dt, w_dt, b_dt = ctx.dtypes
        return (grad_h.to(h_dt) if grad_h is not None else None,
                grad_w.to(w_dt) if grad_w is not None else None,
                grad_b.to(b_dt) if grad_b is not None else None, None, None, None, None, None)


def head_log_probs(module: nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: float,
                   with_entropy: bool, chunk_size: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``(M,)`` and (``with_entropy``) entropy ``(M,)``, float32 nats, of ``targets``
    under ``softmax(lm_head(hidden) / temperature)``, ``chunk_size`` positions at a time.

    Args:
        module: the causal LM (or :class:`PolicyWithLogZ`) whose forward produced ``hidden``.
        hidden: ``(M, hidden_size)`` final-norm hidden states of the predicting positions.
        targets: ``(M,)`` token ids.
        temperature: ``<= 0`` or 1 = none (as the plain path).
    Raises:
        ValueError: ``chunk_size < 1`` or a model whose logits are not ``lm_head(hidden)``.
        RuntimeError: the head's weight is still sharded (a DTensor) after the forward.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size={chunk_size}: must be >= 1 (actor_rollout_ref.model.fused_kernel_options.chunk_size)")
    reason = fused_head_unsupported(module)
    if reason is not None:
        raise ValueError(f"chunked LM-head log-probs: {reason}; set actor_rollout_ref.model.use_fused_kernels=false")
    head = output_head(module)
    weight, bias = head.weight, head.bias
    if isinstance(weight, DTensor) or weight.dim() != 2:
        raise RuntimeError("the LM head's weight is not the full (vocab, hidden) matrix after the model's forward "
                           "(a sharded DTensor, or FSDP1's flat shard): the engine must keep the root unit unsharded "
                           "until backward (TrainEngine.head_readable_after_forward); or set use_fused_kernels=false")
    t = float(temperature) if temperature and temperature > 0 else 1.0
    logp, ent = ChunkedLinearLogProbs.apply(hidden, weight, bias, targets, t, int(chunk_size), with_entropy,
                                            _impl_backend)
    return logp, (ent if with_entropy else None)


def scatter_flat(index: torch.Tensor, values: torch.Tensor, shape: torch.Size | tuple[int, ...]) -> torch.Tensor:
    """``shape`` float tensor holding ``values (M,)`` at the row-major positions ``index (M,)`` int64 and 0
    elsewhere, without a host read (differentiable in ``values``)."""
    flat = torch.zeros(math.prod(shape), dtype=values.dtype, device=values.device)
    return flat.index_copy(0, index, values).view(*shape)

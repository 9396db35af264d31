"""Varlen (``cu_seqlens``) attention for the padding-free packed forward (:mod:`rlforge.engine.packing`).

The packed row ``(1, N)`` holds several sequences back to back.  Without help, transformers
turns the position resets into a dense block-diagonal causal mask ``(N, N)`` for ``sdpa``, so
attention costs ``N^2`` for the whole row.  The attention implementation registered here as
``"rlforge_varlen"`` instead gets the sequence boundaries and runs each sequence's own causal
attention:

* packed forward (the caller passes ``cu_seq_lens_q/k`` and ``max_length_q/k``, the names of
  transformers' ``FlashAttentionKwargs``): on CUDA ``torch.nn.attention.varlen.varlen_attn``
  (PyTorch's flash kernel, with backward) on ``(N, heads, head_dim)``; elsewhere (CPU, a torch
  without ``varlen_attn``, float32 without autocast, head_dim > 256) a per-sequence loop of
  ``F.scaled_dot_product_attention(is_causal=True)``, which the CPU tests exercise;
* any other call (padded forwards, HF ``generate``): transformers' own ``sdpa_attention_forward``
  unchanged, with transformers' ``sdpa`` mask function, so the implementation is safe to set on
  a model globally.

The packed caller passes a ``(1, 1, 1, 1)`` placeholder 4D ``attention_mask``: transformers
returns a 4D mask unchanged (``masking_utils._preprocess_mask_arguments``), so no ``(N, N)``
mask is built; the varlen path ignores it.  The model class is not patched: transformers calls
registered attention functions through ``ALL_ATTENTION_FUNCTIONS``.

Sliding-window layers (``sliding_window`` kwarg, or the module's own attribute as in
Qwen2-MoE) keep ``sliding_window`` keys (the query and ``sliding_window - 1`` before it), as
transformers' ``sliding_window_overlay`` does.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from rlforge.errors import RLForgeWarning

ATTN_IMPLEMENTATION = "rlforge_varlen"

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "mixtral")
"""``config.model_type`` values whose attention goes through transformers' ``ALL_ATTENTION_FUNCTIONS``
with plain causal softmax attention (no soft-capping, sinks or ALiBi), so the varlen path is exact."""

_VARLEN_KWARGS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


@functools.cache
def _varlen_attn() -> tuple[Callable[..., torch.Tensor] | None, frozenset[str]]:
    """``torch.nn.attention.varlen.varlen_attn`` and its parameter names, or ``(None, {})``."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None, frozenset()
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def varlen_available(device: torch.device) -> bool:
    """Whether ``varlen_attn`` can run on ``device``: CUDA, a torch that ships it, and a GPU
    the flash kernel supports (compute capability 8.0 or newer)."""
    if device.type != "cuda" or not torch.cuda.is_available() or _varlen_attn()[0] is None:
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


def register() -> None:
    """Register ``"rlforge_varlen"`` with transformers (attention function and mask function).
    Idempotent; needed before ``model.set_attn_implementation("rlforge_varlen")``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, varlen_attention_forward)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, _sdpa_mask)


def _sdpa_mask(*args: Any, **kwargs: Any) -> Any:
    """transformers' ``sdpa`` mask function (looked up per call, so a re-registered one is used)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    return ALL_MASK_ATTENTION_FUNCTIONS["sdpa"](*args, **kwargs)


def attn_implementation(module: torch.nn.Module) -> str | None:
    """``config._attn_implementation`` of a causal LM or value model, also when wrapped in a
    :class:`~rlforge.models.log_z.PolicyWithLogZ` (``.lm``); FSDP2 keeps the HF class."""
    cfg = getattr(module, "config", None)
    if cfg is None:
        cfg = getattr(getattr(module, "lm", None), "config", None)
    return getattr(cfg, "_attn_implementation", None)


KV_INDEX_KWARG = "rlforge_kv_index"
"""The model kwarg of the shared-prompt layout's key positions (passed through to the attention function)."""


def packed_attention_args(module: torch.nn.Module, cu_seqlens: torch.Tensor, max_len: int | None = None,
                          kv_index: torch.Tensor | None = None, cu_seqlens_k: torch.Tensor | None = None,
                          max_len_k: int | None = None) -> tuple[torch.Tensor | None, dict]:
    """``(attention_mask, extra model kwargs)`` for a packed row with sequence offsets
    ``cu_seqlens`` ``(num_seqs + 1,)`` int32 whose longest sequence is ``max_len`` tokens.

    With ``rlforge_varlen``: a ``(1, 1, 1, 1)`` bool placeholder mask (so transformers builds
    no ``(N, N)`` mask) and the ``cu_seq_lens_q/k``, ``max_length_q/k`` kwargs (``max_len=None``:
    one host read of the device offsets for the longest sequence).  Otherwise ``(None, {})``:
    transformers derives the block-diagonal mask from the position resets.

    The shared-prompt layout (:class:`~rlforge.engine.packing.PackPlan`) also gives ``kv_index``
    ``(Nk,)`` int64, the key offsets ``cu_seqlens_k`` and the longest key segment ``max_len_k``.

    Raises:
        ValueError: ``kv_index`` for a model not on ``rlforge_varlen`` (no other attention can
            read the layout).
    """
    if attn_implementation(module) != ATTN_IMPLEMENTATION:
        if kv_index is not None:
            raise ValueError("the shared-prompt packed layout needs attn_implementation='rlforge_varlen', "
                             f"the model has {attn_implementation(module)!r}")
        return None, {}
    if max_len is None:
        max_len = int((cu_seqlens[1:] - cu_seqlens[:-1]).max()) if cu_seqlens.numel() > 1 else 0
    placeholder = torch.ones((1, 1, 1, 1), dtype=torch.bool, device=cu_seqlens.device)
    kwargs: dict[str, Any] = {"cu_seq_lens_q": cu_seqlens, "cu_seq_lens_k": cu_seqlens, "max_length_q": max_len,
                              "max_length_k": max_len}
    if kv_index is not None:
        assert cu_seqlens_k is not None and max_len_k is not None
        kwargs.update({"cu_seq_lens_k": cu_seqlens_k, "max_length_k": max_len_k, KV_INDEX_KWARG: kv_index})
    return placeholder, kwargs


def varlen_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function convention.

    Args:
        query: ``(B, Hq, S, D)``; key, value: ``(B, Hkv, S, D)``, ``Hq % Hkv == 0``.
        attention_mask: ignored on the packed path; passed on to sdpa otherwise.
        kwargs: with ``cu_seq_lens_q`` ``(num_seqs + 1,)`` int32 (and ``cu_seq_lens_k``,
            ``max_length_q``, ``max_length_k``), the packed path (``B == 1``); else sdpa.  With
            ``rlforge_kv_index`` ``(Nk,)`` int64 as well (the shared-prompt layout), the keys and
            values of query segment ``i`` are the packed rows ``kv_index[cu_k[i]:cu_k[i+1]]``, and
            each query attends causally with the diagonal at its segment's end (bottom-right).

    Returns:
        ``(attn_output (B, S, Hq, D), None)``.

    Raises:
        ValueError: on the packed path with ``B != 1`` or attention dropout.
    """
    if kwargs.get("cu_seq_lens_q") is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"rlforge_varlen: packed attention needs one row (batch 1), got batch {query.shape[0]}")
    if dropout:
        raise ValueError("rlforge_varlen: attention dropout is not supported on the packed path; "
                         "set override_config.attention_dropout=0.0 or another attn_implementation")
    cu_q = kwargs["cu_seq_lens_q"]
    cu_k = kwargs.get("cu_seq_lens_k")
    cu_k = cu_q if cu_k is None else cu_k
    max_q = int(kwargs.get("max_length_q") or query.shape[2])
    max_k = int(kwargs.get("max_length_k") or max_q)
    window = kwargs.get("sliding_window") or getattr(module, "sliding_window", None)
    window = int(window) if window and window > 0 else None
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))  # (N, H, D)
    kv_index = kwargs.get(KV_INDEX_KWARG)
    if kv_index is not None:  # shared prompts: each segment's keys gathered (differentiable; grads sum)
        k, v = k.index_select(0, kv_index), v.index_select(0, kv_index)
    out = _flash_varlen(q, k, v, cu_q, cu_k, max_q, max_k, scaling, window)
    if out is None:
        out = sdpa_varlen_reference(q, k, v, cu_q, cu_k, scaling, window)
    return out.unsqueeze(0), None


def _flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor,
                  max_q: int, max_k: int, scale: float | None, window: int | None) -> torch.Tensor | None:
    """``varlen_attn`` on ``(N, H, D)`` tensors, causal, output ``(N, Hq, D)``; None where it
    cannot run (not CUDA, no ``varlen_attn``, float32 outside autocast, head_dim > 256, or a
    sliding window on a torch whose ``varlen_attn`` has no ``window_size``)."""
    fn, params = _varlen_attn()
    if fn is None or not q.is_cuda:
        return None
    dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else q.dtype
    reason = None
    if dtype not in (torch.float16, torch.bfloat16):
        reason = f"it needs float16/bfloat16 inputs, got {dtype} (use mixed precision)"
    elif q.shape[-1] > 256:
        reason = f"head_dim {q.shape[-1]} > 256"
    elif window is not None and max_k > window and "window_size" not in params:
        reason = "this torch's varlen_attn has no window_size for the sliding window"
    if reason is not None:
        warnings.warn(f"rlforge_varlen: varlen_attn cannot run ({reason}); using a per-sequence SDPA loop",
                      category=RLForgeWarning, stacklevel=3)
        return None
    # Under autocast, RoPE leaves q/k float32 while v is bf16; SDPA would autocast them, the custom op does not.
    return call_varlen_attn(fn, params, q.to(dtype), k.to(dtype), v.to(dtype), cu_q, cu_k, max_q, max_k, scale,
                            window)


def call_varlen_attn(fn: Callable[..., torch.Tensor], params: frozenset[str], q: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, max_q: int, max_k: int,
                     scale: float | None, window: int | None) -> torch.Tensor:
    """Call ``varlen_attn`` (``fn``, whose parameter names are ``params``) causally on
    ``q (N, Hq, D)``, ``k, v (N, Hkv, D)``; returns ``(N, Hq, D)``.

    torch >= 2.11: ``window_size=(left, 0)`` (``(-1, 0)`` = causal), ``enable_gqa`` where
    present; older: ``is_causal=True`` and K/V heads repeated to the query heads.
    """
    kw: dict[str, Any] = {"scale": scale}
    if "window_size" in params:
        kw["window_size"] = (window - 1 if window is not None else -1, 0)  # (left, right): causal
    elif window is not None and max_k > window:
        raise ValueError("this torch's varlen_attn has no window_size; a sliding window needs torch >= 2.11")
    else:
        kw["is_causal"] = True
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:
            rep = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    return fn(q, k, v, cu_q, cu_k, max_q, max_k, **kw)


def sdpa_varlen_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor,
                          cu_k: torch.Tensor, scale: float | None = None, window: int | None = None) -> torch.Tensor:
    """Causal attention per sequence with ``F.scaled_dot_product_attention``: the CPU path and
    the reference for the CUDA kernel.  Where a query segment is shorter than its key segment (the
    shared-prompt layout) the causal diagonal sits at the segment's end: query ``i`` of ``Lq`` sees
    keys ``j <= i + Lk - Lq``, as in flash attention.

    Args:
        q: ``(Nq, Hq, D)``; k, v: ``(Nk, Hkv, D)``; cu_q, cu_k: ``(num_seqs + 1,)`` offsets.
        window: sliding window (keys ``i - window < j <= i``), None for full causal.

    Returns:
        ``(Nq, Hq, D)``, in the inputs' (or autocast) dtype.
    """
    gqa = q.shape[1] != k.shape[1]
    outs = []
    for (qs, qe), (ks, ke) in zip(_bounds(cu_q), _bounds(cu_k), strict=True):
        if qe == qs:
            continue
        qi, ki, vi = (t.transpose(0, 1)[None] for t in (q[qs:qe], k[ks:ke], v[ks:ke]))  # (1, H, L, D)
        mask = None
        if (window is not None and ke - ks > window) or ke - ks != qe - qs:
            # causal with the diagonal at the segment's end (bottom-right, as the flash kernel aligns it)
            i = torch.arange(qe - qs, device=q.device)[:, None] + (ke - ks) - (qe - qs)
            j = torch.arange(ke - ks, device=q.device)[None, :]
            mask = j <= i
            if window is not None:
                mask = mask & (j > i - window)
        o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, is_causal=mask is None, scale=scale,
                                           enable_gqa=gqa)
        outs.append(o[0].transpose(0, 1))
    if not outs:
        return q.new_zeros(q.shape)
    return torch.cat(outs, 0)


def _bounds(cu: torch.Tensor) -> list[tuple[int, int]]:
    c = cu.tolist()
    return list(zip(c[:-1], c[1:], strict=True))


def unsupported_reason(module: torch.nn.Module) -> str | None:
    """Why ``rlforge_varlen`` would not be exact for ``module``, or None when it is."""
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        return (f"model_type={model_type!r} is not one whose attention rlforge_varlen reproduces "
                f"({', '.join(SUPPORTED_MODEL_TYPES)})")
    return None


def maybe_select_varlen(module: torch.nn.Module, device: torch.device, packed: bool,
                          override_config: dict[str, Any] | None) -> bool:
    """Switch ``module`` to ``rlforge_varlen`` when the packed forward is used (``packed``), the
    user did not choose ``override_config.attn_implementation``, the model runs on a CUDA device
    where ``varlen_attn`` exists and the architecture is supported.  Returns whether it did."""
    if not packed or (override_config or {}).get("attn_implementation"):
        return False
    if not varlen_available(device) or unsupported_reason(module) is not None:
        return False
    register()
    module.set_attn_implementation(ATTN_IMPLEMENTATION)
    return True

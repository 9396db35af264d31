"""Attention over the paged KV cache.

Two kinds of rows reach attention in one engine step:

* **decode rows** (one new token each) read their whole context from the cache through a
  block table.  :func:`decode_attention` picks the kernel: the Triton paged kernel
  (:mod:`rlforge.rollout.native.triton_attention`) on CUDA, or :func:`decode_attention_torch`
  (gather the blocks, masked softmax in float32), the CPU fallback that the tests exercise.
  ``benchmarks/rollout_throughput.py --attention`` times both on the GPU.
* **prefill rows** (a chunk of a prompt, maybe after cached prefix blocks) go through
  :func:`prefill_attention`, one ``scaled_dot_product_attention`` per sequence.

Shapes: ``q: [B, H, D]``; one layer's cache ``k_cache, v_cache: [num_blocks, block_size,
KVH, D]``; ``block_tables: [B, max_blocks]`` int32 (entries past a row's context are
ignored); ``context_lens: [B]`` int32 (0 = a padding row, whose output is 0).  GQA: query
head ``h`` reads KV head ``h // (H // KVH)``, as transformers' ``repeat_kv`` does.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

ATTENTION_BACKENDS = ("auto", "triton", "torch")
"""``auto``: Triton on CUDA when it imports, else torch."""


def decode_attention_torch(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """Reference paged decode attention: gather every row's blocks, mask past ``context_lens``.

    Returns ``[B, H, D]`` in ``q.dtype``; scores and softmax in float32.  Memory is
    ``B * max_blocks * block_size * KVH * D`` per K and V: a fallback, not a fast path.
    """
    b, h, d = q.shape
    kvh = k_cache.shape[2]
    bt = block_tables.long()
    k = k_cache[bt].reshape(b, -1, kvh, d).float()  # [B, T, KVH, D]
    v = v_cache[bt].reshape(b, -1, kvh, d).float()
    qg = q.float().view(b, kvh, h // kvh, d)
    scores = torch.einsum("bkgd,btkd->bkgt", qg, k) * scale
    valid = torch.arange(k.shape[1], device=q.device)[None, :] < context_lens.long()[:, None]  # [B, T]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no context gives 0, not NaN
    out = torch.einsum("bkgt,btkd->bkgd", p, v)
    return out.reshape(b, h, d).to(q.dtype)


def _triton_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(name: str, device: torch.device) -> str:
    """``auto`` -> ``triton`` on CUDA with Triton installed, else ``torch``.

    Raises ValueError for an unknown name, or ``triton`` where it cannot run.
    """
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"native rollout attention backend must be one of {ATTENTION_BACKENDS}, got {name!r}")
    if name == "auto":
        return "triton" if _triton_available(device) else "torch"
    if name == "triton" and not _triton_available(device):
        raise ValueError("native rollout attention backend 'triton' needs a CUDA device and the triton package")
    return name


def decode_attention(
    backend: str, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float,
) -> torch.Tensor:
    """Paged decode attention with a resolved ``backend`` (``triton`` | ``torch``); see the module docstring."""
    if backend == "triton":
        from rlforge.rollout.native.triton_attention import paged_decode_attention

        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale)
    return decode_attention_torch(q, k_cache, v_cache, block_tables, context_lens, scale)


def prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor, context_len: int,
    scale: float,
) -> torch.Tensor:
    """Causal attention of one sequence's ``n`` new tokens ``q: [n, H, D]`` over its first
    ``context_len`` cached tokens (the new ones are the last ``n``).  Returns ``[n, H, D]``."""
    n, h, d = q.shape
    kvh = k_cache.shape[2]
    k = k_cache[block_table].reshape(-1, kvh, d)[:context_len]
    v = v_cache[block_table].reshape(-1, kvh, d)[:context_len]
    k = k.repeat_interleave(h // kvh, dim=1).transpose(0, 1)  # [H, ctx, D]
    v = v.repeat_interleave(h // kvh, dim=1).transpose(0, 1)
    qi = q.transpose(0, 1)  # [H, n, D]
    if n == context_len:  # no cached prefix: plain causal attention (flash kernel on CUDA)
        o = F.scaled_dot_product_attention(qi, k, v, is_causal=True, scale=scale)
    else:
        qpos = torch.arange(context_len - n, context_len, device=q.device)
        mask = torch.arange(context_len, device=q.device)[None, :] <= qpos[:, None]  # [n, ctx]
        o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=scale)
    return o.transpose(0, 1)

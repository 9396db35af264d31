"""Attention over the paged KV cache.

Two kinds of rows reach attention in one engine step:

* **decode rows** (one new token each) read their whole context from the cache through a
  block table.  :func:`decode_attention` picks the kernel: the Triton paged kernel
  (:mod:`rlforge.rollout.native.triton_attention`) on CUDA, or :func:`decode_attention_torch`
  (gather the blocks, masked softmax in float32), the CPU fallback that the tests exercise.
  ``benchmarks/rollout_throughput.py --attention`` times both on the GPU.
  Small batches at long context are split along the context (flash-decoding): each of
  ``num_splits`` chunks gives a partial output and its log-sum-exp, and
  :func:`combine_splits` merges them (:func:`decode_attention_split_torch` is the reference;
  :func:`~rlforge.rollout.native.split_kv.choose_num_splits` is the Triton path's automatic choice).
* **prefill rows** (a chunk of a prompt, maybe after cached prefix blocks) of all sequences
  go through one padded ``scaled_dot_product_attention`` call (:func:`batched_prefill_attention`):
  queries ``[Bp, n_max]`` and each sequence's cached K/V ``[Bp, ctx_max]`` gathered by slot,
  with a causal-and-padding mask.  :func:`prefill_attention` (one sequence) is its reference.

Shapes: ``q: [B, H, D]``; one layer's cache ``k_cache, v_cache: [num_blocks, block_size,
KVH, D]``; ``block_tables: [B, max_blocks]`` int32 (entries past a row's context are
ignored); ``context_lens: [B]`` int32 (0 = a padding row, whose output is 0).  GQA: query
head ``h`` reads KV head ``h // (H // KVH)``, as transformers' ``repeat_kv`` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
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


def split_bounds(context_lens: torch.Tensor, num_splits: int, tile: int) -> torch.Tensor:
    """Tiles per split for each row: ``ceil(ceil(ctx / tile) / num_splits)`` (at least 1), ``[B]`` int64.

    Split ``s`` of a row covers context tiles ``[s * per, min((s + 1) * per, ceil(ctx / tile)))``
    of ``tile`` tokens, so the splits of a row partition its context and trailing splits may be
    empty; the Triton kernel uses the same rule.
    """
    n_tiles = (context_lens.long() + tile - 1) // tile
    return ((n_tiles + num_splits - 1) // num_splits).clamp_min(1)


def split_partials_torch(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, num_splits: int, tile: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each split's normalised partial output ``o: [B, H, S, D]`` and log-sum-exp ``lse: [B, H, S]``
    (float32; an empty split has ``o = 0`` and ``lse = -inf``), chunks as in :func:`split_bounds`.

    With ``m_s`` the split's largest score and ``l_s = sum exp(score - m_s)`` over its tokens:
    ``o_s = sum exp(score - m_s) v / l_s`` and ``lse_s = m_s + log l_s``.
    """
    b, h, d = q.shape
    kvh = k_cache.shape[2]
    bt = block_tables.long()
    k = k_cache[bt].reshape(b, -1, kvh, d).float()  # [B, T, KVH, D]
    v = v_cache[bt].reshape(b, -1, kvh, d).float()
    qg = q.float().view(b, kvh, h // kvh, d)
    scores = torch.einsum("bkgd,btkd->bkgt", qg, k) * scale  # [B, KVH, G, T]
    pos = torch.arange(k.shape[1], device=q.device)
    chunk = (pos[None, :] // tile) // split_bounds(context_lens, num_splits, tile)[:, None]  # [B, T]
    valid = pos[None, :] < context_lens.long()[:, None]
    member = (chunk[:, None, :] == torch.arange(num_splits, device=q.device)[None, :, None]) & valid[:, None, :]
    s = scores[:, :, :, None, :].masked_fill(~member[:, None, None], float("-inf"))  # [B, KVH, G, S, T]
    m = s.amax(-1)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m[..., None])
    lsum = p.sum(-1)
    o = torch.einsum("bkgst,btkd->bkgsd", p, v) / lsum.clamp_min(1e-30)[..., None]
    lse = torch.where(lsum > 0, m + torch.log(lsum.clamp_min(1e-30)), torch.full_like(m, float("-inf")))
    return o.reshape(b, h, num_splits, d), lse.reshape(b, h, num_splits)


def combine_splits(o: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Merge split partials ``o: [..., S, D]``, ``lse: [..., S]`` into ``[..., D]`` (float32):
    ``sum_s exp(lse_s - M) o_s / sum_s exp(lse_s - M)`` with ``M = max_s lse_s``; 0 where every
    split is empty (a row with no context)."""
    mx = lse.amax(-1, keepdim=True)
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    w = torch.exp(lse - mx)  # 0 for an empty split
    den = w.sum(-1, keepdim=True)
    return (w[..., None] * o.float()).sum(-2) / den.clamp_min(1e-30)


def decode_attention_split_torch(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
    context_lens: torch.Tensor, scale: float, num_splits: int, tile: int | None = None,
) -> torch.Tensor:
    """Split-KV (flash-decoding) reference: :func:`split_partials_torch` then :func:`combine_splits`.
    ``tile`` defaults to the block size.  Returns ``[B, H, D]`` in ``q.dtype``; equals
    :func:`decode_attention_torch` up to float rounding for any ``num_splits >= 1``."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be >= 1, got {num_splits}")
    o, lse = split_partials_torch(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits,
                                  tile or k_cache.shape[1])
    return combine_splits(o, lse).to(q.dtype)


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
    context_lens: torch.Tensor, scale: float, num_splits: int | None = None,
) -> torch.Tensor:
    """Paged decode attention with a resolved ``backend`` (``triton`` | ``torch``); see the module docstring.

    ``num_splits``: context splits (flash-decoding); None = :func:`~rlforge.rollout.native.split_kv.choose_num_splits` on the
    Triton path, unsplit on the torch path (the split torch reference is for tests, not speed).
    """
    if backend == "triton":
        from rlforge.rollout.native.triton_attention import paged_decode_attention

        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits=num_splits)
    if num_splits is not None and num_splits > 1:
        return decode_attention_split_torch(q, k_cache, v_cache, block_tables, context_lens, scale, num_splits)
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


@dataclass
class PrefillBatch:
    """Padded gather indices of one step's prefill chunks (``Bp`` sequences).

    ``q_rows: [Bp, n_max]`` flat query rows (0 where padded); ``out_index: [N]``, the positions
    of the ``N`` real queries in the flattened ``[Bp * n_max]`` padded layout, and ``out_rows: [N]``
    their flat query rows (both computed on the host, so dropping the padding needs no device
    sync, unlike a boolean mask); ``kv_slots: [Bp, ctx_max]`` flat cache slots of each sequence's
    context (0 where padded); ``mask: [Bp, 1, n_max, ctx_max]``: key ``j`` is visible to query
    ``i`` when ``j`` is inside the context and not after the query's position.
    """

    q_rows: torch.Tensor
    out_index: torch.Tensor
    out_rows: torch.Tensor
    kv_slots: torch.Tensor
    mask: torch.Tensor


def build_prefill_batch(
    chunks: list[tuple[int, int, int, list[int]]], block_size: int, device: torch.device
) -> PrefillBatch:
    """``chunks``: ``(query_start, query_len, context_len, block_table)`` per sequence, where
    the chunk's tokens are the last ``query_len`` of the ``context_len`` cached ones."""
    bp = len(chunks)
    starts, ns, ctxs = (np.fromiter((c[k] for c in chunks), dtype=np.int64, count=bp) for k in range(3))
    n_max, ctx_max = int(ns.max()), int(ctxs.max())
    width = max(len(c[3]) for c in chunks)
    tables = np.zeros((bp, width), dtype=np.int64)
    for i, c in enumerate(chunks):
        tables[i, : len(c[3])] = c[3]
    j = np.arange(n_max)
    in_chunk = j[None, :] < ns[:, None]
    q_rows = np.where(in_chunk, starts[:, None] + j, 0)
    q_pos = np.where(in_chunk, (ctxs - ns)[:, None] + j, -1)
    pos = np.arange(ctx_max)
    in_ctx = pos[None, :] < ctxs[:, None]
    slots = np.where(in_ctx, tables[:, np.minimum(pos // block_size, width - 1)] * block_size + pos % block_size, 0)
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device, non_blocking=True)  # noqa: E731
    out_index = np.flatnonzero(q_pos.reshape(-1) >= 0)
    # the [Bp, n_max, ctx_max] mask is built where it is used (megabytes the host need not fill and copy)
    kv_pos = torch.arange(ctx_max, device=device)[None, None, :]
    mask = (kv_pos <= t(q_pos)[:, :, None]) & (kv_pos < t(ctxs)[:, None, None])
    return PrefillBatch(t(q_rows), t(out_index), t(q_rows.reshape(-1)[out_index]), t(slots), mask[:, None])


def batched_prefill_attention(
    q: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, pb: PrefillBatch, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Prefill attention of every chunk in ``pb`` at once.  ``q: [T, H, D]`` (all rows of the
    step), ``k_flat, v_flat: [num_slots, KVH, D]`` (one layer's cache).  Returns the flat rows
    ``[N]`` and their outputs ``[N, H, D]`` (padding removed)."""
    _, h, d = q.shape
    kvh = k_flat.shape[1]
    bp, ctx_max = pb.kv_slots.shape
    qb = q[pb.q_rows].transpose(1, 2)  # [Bp, H, n_max, D]
    k = k_flat[pb.kv_slots]  # [Bp, ctx_max, KVH, D]
    v = v_flat[pb.kv_slots]
    if kvh != h:  # GQA: each KV head serves H / KVH query heads
        k = k[:, :, :, None, :].expand(bp, ctx_max, kvh, h // kvh, d).reshape(bp, ctx_max, h, d)
        v = v[:, :, :, None, :].expand(bp, ctx_max, kvh, h // kvh, d).reshape(bp, ctx_max, h, d)
    o = F.scaled_dot_product_attention(qb, k.transpose(1, 2), v.transpose(1, 2), attn_mask=pb.mask, scale=scale)
    o = o.transpose(1, 2).reshape(-1, h, d)  # [Bp * n_max, H, D]
    return pb.out_rows, o.index_select(0, pb.out_index)

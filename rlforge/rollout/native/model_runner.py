"""An explicit forward of HF Llama / Qwen2-family causal LMs over the paged KV cache.

The runner owns the forward and only *reads* the module's weights (``embed_tokens``,
``layers[i].self_attn.{q,k,v,o}_proj`` with optional bias, optional Qwen3 ``q_norm``/``k_norm``,
``input_layernorm``, ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj`` with SiLU,
``norm``, ``lm_head``), each step, so in-place weight updates of the actor are seen at once.
Numerics follow transformers' ``modeling_llama.py``: RMSNorm in float32 then cast back and
scaled, rotate-half RoPE from the module's own ``rotary_emb.inv_freq`` and
``attention_scaling`` (so rope scaling types match), attention scale ``head_dim ** -0.5``,
GQA by repeating each KV head over its group of query heads.

Attention reads the paged cache (:mod:`rlforge.rollout.native.attention`): decode rows in one
batched paged-attention call (a Triton kernel on CUDA), prefill chunks of all sequences in one
padded ``scaled_dot_product_attention`` call.  Sliding-window attention is not supported.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from rlforge.rollout.native.attention import (
    PrefillBatch,
    batched_prefill_attention,
    build_prefill_batch,
    decode_attention,
    resolve_backend,
)
from rlforge.rollout.native.kv_cache import KVCache
from rlforge.rollout.native.rollout_weights import RolloutWeights, Slot
from rlforge.rollout.native.scheduler import SchedulerOutput
from rlforge.rollout.native.tensor_parallel import TPGroup, all_reduce_

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
"""``config.model_type`` values whose decoder layer this runner reproduces."""


def unsupported_reason(module: nn.Module) -> str | None:
    """Why the runner cannot run ``module`` (None when it can)."""
    c = getattr(module, "config", None)
    kind = getattr(c, "model_type", None)
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model_type {kind!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if getattr(c, "use_sliding_window", False) or (kind == "mistral" and getattr(c, "sliding_window", None)):
        return "sliding-window attention is not supported"
    return None


@dataclass(frozen=True)
class ModelSpec:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float

    @classmethod
    def from_module(cls, module: nn.Module, tp_size: int = 1) -> ModelSpec:
        """The spec of ``module``'s decoder; with ``tp_size`` > 1 the heads of one rank of a
        tensor-parallel group (:mod:`.tensor_parallel`; the sizes are checked there)."""
        c = module.config
        why = unsupported_reason(module)
        if why is not None:
            raise NotImplementedError(f"the native rollout cannot run this model: {why}")
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        kv = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
        return cls(c.num_hidden_layers, c.num_attention_heads // tp_size, kv // tp_size, head_dim, c.rms_norm_eps)


@dataclass
class StepInputs:
    """Flat inputs of one mixed step. ``input_ids``/``positions``/``slot_mapping``: ``[T]``;
    per sequence ``i``: query rows ``[query_start[i], query_start[i] + query_len[i])``, context
    length ``context_len[i]`` (cached + new tokens), ``block_tables[i]``; ``sample_rows`` are the
    query rows whose logits are sampled (last token of sequences that reached their end).

    Rows of sequences feeding one token (decode) are attended in one batched call:
    ``decode_rows: [Bd]``, ``decode_block_tables: [Bd, max_blocks]`` int32,
    ``decode_context_lens: [Bd]`` int32.  The others (prefill chunks) in one padded call:
    ``prefill`` (see :class:`~rlforge.rollout.native.attention.PrefillBatch`)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start: list[int]
    query_len: list[int]
    context_len: list[int]
    block_tables: list[list[int]]
    sample_rows: list[int]
    sample_seq_ids: list[int]
    sample_index: torch.Tensor
    """``sample_rows`` on the device (copied with the other inputs, so the step needs no sync)."""
    decode_rows: torch.Tensor | None = None
    decode_block_tables: torch.Tensor | None = None
    decode_context_lens: torch.Tensor | None = None
    prefill: PrefillBatch | None = None


@dataclass
class DecodeInputs:
    """One pure decode step: every row feeds one token and is sampled.  ``input_ids``,
    ``positions``, ``slot_mapping``: ``[B]`` int64; ``block_tables: [B, max_blocks]`` int32;
    ``context_lens: [B]`` int32 (including the new token)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor


def right_padded(rows: list[list[Any]], pad: Any, dtype: Any, min_width: int = 0) -> np.ndarray:
    """``rows`` as one ``[len(rows), max(longest, min_width)]`` array of ``dtype``, right-padded with
    ``pad`` (one flat copy and one masked write, not a copy per row)."""
    lens = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    width = max(int(lens.max()) if len(rows) else 0, min_width)
    arr = np.full((len(rows), width), pad, dtype=dtype)
    arr[np.arange(width)[None, :] < lens[:, None]] = np.fromiter(
        itertools.chain.from_iterable(rows), dtype=dtype, count=int(lens.sum()))
    return arr


def block_table_tensor(tables: list[list[int]], device: torch.device) -> torch.Tensor:
    """``[len(tables), max_len]`` int32, right-padded with block 0 (never read: masked by context length)."""
    return torch.from_numpy(right_padded(tables, 0, np.int32, min_width=1)).to(device, non_blocking=True)


def prepare_inputs(out: SchedulerOutput, block_size: int, device: torch.device) -> StepInputs:
    """The step's host inputs: new tokens, positions and KV slots per scheduled sequence.

    A mixed step carries up to ``max_num_batched_tokens`` prefill tokens and up to
    ``max_num_seqs`` decoding sequences, and the GPU waits while this runs: decode rows (one
    token each) take plain integer arithmetic, prefill chunks one numpy slice each, written
    into arrays sized once for the step (a 960-decode + 64-chunk step: 12.3 ms -> 4.9 ms of
    host time with the prefill batch, ``benchmarks/history/RESULTS-log.md``)."""
    total = out.num_tokens
    pos = np.empty(total, dtype=np.int64)
    slots = np.empty(total, dtype=np.int64)
    ids: list[int] = []
    qs, ql, cl, bts, rows, sids = [], [], [], [], [], []
    t = 0
    for seq, n in zip(out.seqs, out.num_new_tokens, strict=True):
        start = seq.num_computed_tokens
        end, num = start + n, seq.num_tokens
        table = seq.block_table[: -(-end // block_size)]
        qs.append(t)
        if n == 1:
            ids.append(seq.last_token if end == num else seq.token_ids[start])
            pos[t] = start
            slots[t] = table[start // block_size] * block_size + start % block_size
        else:
            ids.extend(seq.prompt_ids[start:end] if end <= len(seq.prompt_ids) else seq.token_ids[start:end])
            p = np.arange(start, end, dtype=np.int64)
            pos[t:t + n] = p
            slots[t:t + n] = np.asarray(table, dtype=np.int64)[p // block_size] * block_size + p % block_size
        t += n
        ql.append(n)
        cl.append(end)
        bts.append(table)
        if end == num:
            rows.append(t - 1)
            sids.append(seq.seq_id)
    return step_inputs(ids, pos, slots, qs, ql, cl, bts, rows, sids, device, block_size)


def step_inputs(
    ids: list[int], pos: list[int] | np.ndarray, slots: list[int] | np.ndarray, qs: list[int], ql: list[int],
    cl: list[int], bts: list[list[int]], rows: list[int], sids: list[int], device: torch.device, block_size: int,
) -> StepInputs:
    """:class:`StepInputs` from host lists or int64 arrays (see its fields), with the decode/prefill split."""
    t = lambda x: torch.as_tensor(np.asarray(x, dtype=np.int64)).to(device, non_blocking=True)  # noqa: E731
    inp = StepInputs(t(ids), t(pos), t(slots), qs, ql, cl, bts, rows, sids, t(rows))
    dec = [i for i, n in enumerate(ql) if n == 1]
    if dec:
        inp.decode_rows = t([qs[i] for i in dec])
        inp.decode_block_tables = block_table_tensor([bts[i] for i in dec], device)
        # built on the host and copied without waiting for the stream (a copy with `device=` waits for
        # every queued step, which would undo overlapped steps)
        inp.decode_context_lens = torch.tensor([cl[i] for i in dec], dtype=torch.int32).to(device, non_blocking=True)
    chunks = [(qs[i], ql[i], cl[i], bts[i]) for i in range(len(ql)) if ql[i] != 1]
    if chunks:
        inp.prefill = build_prefill_batch(chunks, block_size, device)
    return inp


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _project(x: torch.Tensor, slots: list[Slot]) -> list[torch.Tensor]:
    """The outputs of the linears in ``slots`` on ``x`` (a packed slot: one GEMM, split into views)."""
    out: list[torch.Tensor] = []
    for s in slots:
        y = F.linear(x, s.weight, s.bias)
        out += list(y.split(s.sizes, dim=-1)) if len(s.sizes) > 1 else [y]
    return out


class ModelRunner:
    """Runs one engine step through ``module``: :meth:`run` (mixed prefill/decode step, returns
    the sampled rows' logits) or :meth:`decode` (pure decode, returns every row's logits).

    ``attention``: ``auto`` | ``triton`` | ``torch`` for decode rows (see :mod:`.attention`).
    ``fused``: the layers' elementwise work in the Triton kernels of
    :mod:`.triton_fused` (four launches per layer instead of ~30); None = exactly when the
    attention backend is ``triton`` (CUDA with Triton).  Raises ValueError for ``fused=True``
    where Triton cannot run.  ``pack``: Q/K/V and gate/up as one GEMM each
    (:mod:`.rollout_weights`); None = on CUDA.  The GEMM weights are read in the cache's dtype
    (the compute dtype), cast once per generation by :meth:`refresh_weights`, not per step.
    ``tp``: this rank's tensor-parallel group (``module`` sharded by
    :func:`~.tensor_parallel.shard_module_`; one all-reduce after ``o_proj`` and one after
    ``down_proj`` per layer); None = the whole model on this rank (no collective).
    """

    def __init__(
        self, module: nn.Module, cache: KVCache, attention: str = "auto", fused: bool | None = None,
        pack: bool | None = None, tp: TPGroup | None = None,
    ) -> None:
        self.module = module
        self.tp = tp
        self.spec = ModelSpec.from_module(module, 1 if tp is None else tp.size)
        self.cache = cache
        if pack is None:
            pack = cache.data.device.type == "cuda"
        self.weights = RolloutWeights(module, cache.data.dtype, bool(pack))
        self.backend = resolve_backend(attention, cache.data.device)
        self.scale = self.spec.head_dim ** -0.5
        half = self.spec.head_dim // 2
        shape_ok = self.spec.head_dim % 2 == 0 and half & (half - 1) == 0  # the RoPE kernel's head layout
        if fused is None:
            fused = self.backend == "triton" and shape_ok
        elif fused and (resolve_backend("auto", cache.data.device) != "triton" or not shape_ok):
            raise ValueError("the fused rollout kernels need a CUDA device, the triton package and a power-of-two "
                             f"head dimension (this model's is {self.spec.head_dim})")
        self.fused = bool(fused)

    def refresh_weights(self) -> None:
        """Copy the module's current weights into the runner's packed / cast copies (before each generation)."""
        self.weights.refresh()

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        rot = self.module.model.rotary_emb
        inv_freq = rot.inv_freq.to(device=positions.device, dtype=torch.float32)
        freqs = positions[:, None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(rot, "attention_scaling", 1.0)
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)

    def _decode_attn(self, q: torch.Tensor, layer: int, bt: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        kc, vc = self.cache.data[layer, 0], self.cache.data[layer, 1]
        return decode_attention(self.backend, q.to(kc.dtype), kc, vc, bt, ctx, self.scale)

    def _mixed_attn(self, q: torch.Tensor, layer: int, inp: StepInputs) -> torch.Tensor:
        """``q: [T, H, D]`` -> ``[T, H, D]``: decode rows in one paged call, prefill chunks in another."""
        q = q.to(self.cache.data.dtype)
        out = torch.empty_like(q)
        if inp.decode_rows is not None:
            out[inp.decode_rows] = self._decode_attn(q[inp.decode_rows], layer, inp.decode_block_tables,
                                                     inp.decode_context_lens)
        if inp.prefill is not None:
            rows, o = batched_prefill_attention(q, self.cache.flat(layer, 0), self.cache.flat(layer, 1), inp.prefill,
                                                self.scale)
            out[rows] = o
        return out

    def _body(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
        attend: Callable[[torch.Tensor, int], torch.Tensor],
    ) -> torch.Tensor:
        """The decoder layers over ``T`` flat tokens; writes their K/V at ``slot_mapping``; returns ``h: [T, hidden]``."""
        if self.fused:
            return self._body_fused(input_ids, positions, slot_mapping, attend)
        s, m = self.spec, self.module.model
        h = F.embedding(input_ids, m.embed_tokens.weight)
        cos, sin = self._rope(positions, h.dtype)
        cos, sin = cos[:, None, :], sin[:, None, :]
        T = h.shape[0]
        for i, layer in enumerate(m.layers):
            att, lw = layer.self_attn, self.weights.layers[i]
            x = rms_norm(h, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
            q, k, v = _project(x, lw.qkv)
            q = q.reshape(T, s.num_heads, s.head_dim)
            k = k.reshape(T, s.num_kv_heads, s.head_dim)
            v = v.reshape(T, s.num_kv_heads, s.head_dim)
            if getattr(att, "q_norm", None) is not None:  # Qwen3
                q = rms_norm(q, att.q_norm.weight, att.q_norm.variance_epsilon)
                k = rms_norm(k, att.k_norm.weight, att.k_norm.variance_epsilon)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.cache.flat(i, 0)[slot_mapping] = k.to(self.cache.data.dtype)
            self.cache.flat(i, 1)[slot_mapping] = v.to(self.cache.data.dtype)
            a = attend(q, i).to(h.dtype)
            o = F.linear(a.reshape(T, -1), *lw.o.linear)
            h = h + (o if self.tp is None else all_reduce_(o, self.tp))
            x = rms_norm(h, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
            gate, up = _project(x, lw.gate_up)
            o = F.linear(F.silu(gate) * up, *lw.down.linear)
            h = h + (o if self.tp is None else all_reduce_(o, self.tp))
        return h

    def _body_fused(
        self, input_ids: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
        attend: Callable[[torch.Tensor, int], torch.Tensor],
    ) -> torch.Tensor:
        """:meth:`_body` with the elementwise work in the Triton kernels of :mod:`.triton_fused`:
        each residual add is fused into the next RMSNorm, RoPE into the K/V cache write."""
        from rlforge.rollout.native.triton_fused import add_rms_norm, rope_and_cache, silu_mul

        s, m = self.spec, self.module.model
        h = F.embedding(input_ids, m.embed_tokens.weight)
        cos, sin = self._rope(positions, h.dtype)
        T = h.shape[0]
        delta: torch.Tensor | None = None  # the last MLP output, not yet added to h
        for i, layer in enumerate(m.layers):
            att, ln, lw = layer.self_attn, layer.input_layernorm, self.weights.layers[i]
            x, h = add_rms_norm(h, ln.weight, ln.variance_epsilon) if delta is None else \
                add_rms_norm(delta, ln.weight, ln.variance_epsilon, residual=h)
            q, k, v = _project(x, lw.qkv)  # views of one packed output keep their row stride
            q = q.view(T, s.num_heads, s.head_dim)
            k = k.view(T, s.num_kv_heads, s.head_dim)
            v = v.view(T, s.num_kv_heads, s.head_dim)
            if getattr(att, "q_norm", None) is not None:  # Qwen3
                q = add_rms_norm(q, att.q_norm.weight, att.q_norm.variance_epsilon)[0]
                k = add_rms_norm(k, att.k_norm.weight, att.k_norm.variance_epsilon)[0]
            q = rope_and_cache(q, k, v, cos, sin, slot_mapping, self.cache.flat(i, 0), self.cache.flat(i, 1))
            a = attend(q, i).to(h.dtype)
            ln = layer.post_attention_layernorm
            o = F.linear(a.reshape(T, -1), *lw.o.linear)
            x, h = add_rms_norm(o if self.tp is None else all_reduce_(o, self.tp), ln.weight, ln.variance_epsilon,
                                residual=h)
            delta = F.linear(silu_mul(*_project(x, lw.gate_up)), *lw.down.linear)
            if self.tp is not None:
                all_reduce_(delta, self.tp)
        return h if delta is None else h + delta

    def _logits(self, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``[T, V]`` logits; written into ``out`` (``[T, V]``, the result's dtype) when given, so a
        captured step needs no copy of the whole vocabulary out of its memory pool."""
        m = self.module.model
        x = rms_norm(h, m.norm.weight, m.norm.variance_epsilon)
        weight, bias = self.weights.lm_head.linear
        if out is None:
            return F.linear(x, weight, bias)
        if torch.is_autocast_enabled() or out.dtype != x.dtype or weight.dtype != x.dtype:
            return out.copy_(F.linear(x, weight, bias))  # autocast has no out= matmuls
        if bias is None:
            return torch.mm(x, weight.t(), out=out)
        return torch.addmm(bias, x, weight.t(), out=out)

    @torch.no_grad()
    def run(self, inp: StepInputs) -> torch.Tensor:
        """A mixed step; returns ``logits: [len(inp.sample_rows), V]`` in the compute dtype."""
        h = self._body(inp.input_ids, inp.positions, inp.slot_mapping, lambda q, i: self._mixed_attn(q, i, inp))
        return self._logits(h.index_select(0, inp.sample_index))

    @torch.no_grad()
    def decode(self, d: DecodeInputs, out: torch.Tensor | None = None) -> torch.Tensor:
        """A pure decode step; returns ``logits: [B, V]`` in the compute dtype (the sampler
        reads them once in float32, so no float32 copy of the whole vocabulary is stored), in
        ``out`` when given.  Fixed shapes, no host sync: it can be captured in a CUDA graph."""
        h = self._body(d.input_ids, d.positions, d.slot_mapping,
                       lambda q, i: self._decode_attn(q, i, d.block_tables, d.context_lens))
        return self._logits(h, out)

"""An explicit forward of HF Llama / Qwen2-family causal LMs over the paged KV cache.

The runner owns the forward and only *reads* the module's weights (``embed_tokens``,
``layers[i].self_attn.{q,k,v,o}_proj`` with optional bias, optional Qwen3 ``q_norm``/``k_norm``,
``input_layernorm``, ``post_attention_layernorm``, ``mlp.{gate,up,down}_proj`` with SiLU,
``norm``, ``lm_head``), each step, so in-place weight updates of the actor are seen at once.
Numerics follow transformers' ``modeling_llama.py``: RMSNorm in float32 then cast back and
scaled, rotate-half RoPE from the module's own ``rotary_emb.inv_freq`` and
``attention_scaling`` (so rope scaling types match), attention scale ``head_dim ** -0.5``,
GQA by repeating each KV head over its group of query heads.

Attention is a plain gather over each sequence's block table and
``scaled_dot_product_attention`` per sequence: the CPU fallback, not a fast kernel.
Sliding-window attention is not supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from rlforge.rollout.native.kv_cache import KVCache
from rlforge.rollout.native.scheduler import SchedulerOutput


@dataclass(frozen=True)
class ModelSpec:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float

    @classmethod
    def from_module(cls, module: nn.Module) -> ModelSpec:
        c = module.config
        if getattr(c, "use_sliding_window", False):
            raise NotImplementedError("the native rollout does not support sliding-window attention")
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        return cls(
            c.num_hidden_layers, c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads,
            head_dim, c.rms_norm_eps,
        )


@dataclass
class StepInputs:
    """Flat inputs of one step. ``input_ids``/``positions``/``slot_mapping``: ``[T]``;
    per sequence ``i``: query rows ``[query_start[i], query_start[i] + query_len[i])``, context
    length ``context_len[i]`` (cached + new tokens), ``block_tables[i]``; ``sample_rows`` are the
    query rows whose logits are sampled (last token of sequences that reached their end)."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    query_start: list[int]
    query_len: list[int]
    context_len: list[int]
    block_tables: list[list[int]]
    sample_rows: list[int]
    sample_seq_ids: list[int]


def prepare_inputs(out: SchedulerOutput, block_size: int, device: torch.device) -> StepInputs:
    ids, pos, slots, qs, ql, cl, bts, rows, sids = [], [], [], [], [], [], [], [], []
    for seq, n in zip(out.seqs, out.num_new_tokens, strict=True):
        start = seq.num_computed_tokens
        qs.append(len(ids))
        toks = seq.token_ids
        ids.extend(toks[start:start + n])
        for p in range(start, start + n):
            pos.append(p)
            slots.append(seq.block_table[p // block_size] * block_size + p % block_size)
        ql.append(n)
        cl.append(start + n)
        bts.append(list(seq.block_table[: -(-(start + n) // block_size)]))
        if start + n == seq.num_tokens:
            rows.append(len(ids) - 1)
            sids.append(seq.seq_id)
    t = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    return StepInputs(t(ids), t(pos), t(slots), qs, ql, cl, bts, rows, sids)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _linear(x: torch.Tensor, lin: nn.Module) -> torch.Tensor:
    return F.linear(x, lin.weight, lin.bias)


class ModelRunner:
    """Runs one scheduler step through ``module`` and returns ``logits: [num_sample_rows, V]``."""

    def __init__(self, module: nn.Module, cache: KVCache) -> None:
        self.module = module
        self.spec = ModelSpec.from_module(module)
        self.cache = cache

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        rot = self.module.model.rotary_emb
        inv_freq = rot.inv_freq.to(device=positions.device, dtype=torch.float32)
        freqs = positions[:, None].float() * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        scale = getattr(rot, "attention_scaling", 1.0)
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)

    def _attention(self, q: torch.Tensor, layer: int, inp: StepInputs) -> torch.Tensor:
        """``q: [T, H, D]`` -> ``[T, H, D]``, reading K/V of each sequence from the cache."""
        s = self.spec
        kc, vc = self.cache.data[layer, 0], self.cache.data[layer, 1]
        group = s.num_heads // s.num_kv_heads
        out = torch.empty_like(q)
        for start, n, ctx, bt in zip(inp.query_start, inp.query_len, inp.context_len, inp.block_tables, strict=True):
            idx = torch.tensor(bt, dtype=torch.long, device=q.device)
            k = kc[idx].reshape(-1, s.num_kv_heads, s.head_dim)[:ctx]
            v = vc[idx].reshape(-1, s.num_kv_heads, s.head_dim)[:ctx]
            k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, ctx, D]
            v = v.repeat_interleave(group, dim=1).transpose(0, 1)
            qi = q[start:start + n].transpose(0, 1)  # [H, n, D]
            qpos = torch.arange(ctx - n, ctx, device=q.device)
            mask = torch.arange(ctx, device=q.device)[None, :] <= qpos[:, None]  # [n, ctx]
            o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=s.head_dim ** -0.5)
            out[start:start + n] = o.transpose(0, 1)
        return out

    @torch.no_grad()
    def run(self, inp: StepInputs) -> torch.Tensor:
        s, m = self.spec, self.module.model
        h = F.embedding(inp.input_ids, m.embed_tokens.weight)
        cos, sin = self._rope(inp.positions, h.dtype)
        cos, sin = cos[:, None, :], sin[:, None, :]
        T = h.shape[0]
        for i, layer in enumerate(m.layers):
            att = layer.self_attn
            x = rms_norm(h, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon)
            q = _linear(x, att.q_proj).view(T, s.num_heads, s.head_dim)
            k = _linear(x, att.k_proj).view(T, s.num_kv_heads, s.head_dim)
            v = _linear(x, att.v_proj).view(T, s.num_kv_heads, s.head_dim)
            if getattr(att, "q_norm", None) is not None:  # Qwen3
                q = rms_norm(q, att.q_norm.weight, att.q_norm.variance_epsilon)
                k = rms_norm(k, att.k_norm.weight, att.k_norm.variance_epsilon)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.cache.flat(i, 0)[inp.slot_mapping] = k.to(self.cache.data.dtype)
            self.cache.flat(i, 1)[inp.slot_mapping] = v.to(self.cache.data.dtype)
            a = self._attention(q, i, inp).to(h.dtype)
            h = h + _linear(a.reshape(T, -1), att.o_proj)
            x = rms_norm(h, layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon)
            mlp = layer.mlp
            h = h + _linear(F.silu(_linear(x, mlp.gate_proj)) * _linear(x, mlp.up_proj), mlp.down_proj)
        rows = torch.tensor(inp.sample_rows, dtype=torch.long, device=h.device)
        h = rms_norm(h[rows], m.norm.weight, m.norm.variance_epsilon)
        return _linear(h, self.module.lm_head).float()

"""Rollout floors: the least time a generation can take on a device, from bytes and FLOPs.

Used by ``benchmarks/rollout_throughput.py``.  A decode step must read every weight once, the
gathered input-embedding rows of its batch, and every running sequence's K/V so far; it must
also do ``2 x (matmul parameters) x batch`` FLOPs plus ``4 x layers x heads x head_dim x context``
for attention.  Its floor is the larger of bytes over bandwidth and FLOPs over the dense bf16
peak.  Prefill is charged at the compute peak (its weights are read once per chunk, which is
far below its FLOPs' time).  The whole run's combined floor is the sum over its decode steps and
its prefill.  Logits written and read by the sampler are not charged: a fused head and sampler
need not store them.

The input-embedding table is **not** charged as read every step (only the batch's rows are
gathered), unless it is tied to the LM head, whose matrix is read whole every step anyway; the
embedding's parameters do no matmul FLOPs, the head's do.

Bandwidths: the device's spec number (:data:`SPEC_BANDWIDTH`, by its name) and the copy
bandwidth measured in the same run are both reported; fractions over the spec number are the
ones that do not flatter.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

PEAK_BF16 = 989e12  # H100/H200 SXM dense bf16 (rlforge.perf.flops)
SPEC_BANDWIDTH = (("H200", 4.8e12), ("H100 NVL", 3.9e12), ("H100 PCIe", 2.0e12), ("H100", 3.35e12),
                  ("H20", 4.0e12), ("A100-SXM4-80GB", 2.039e12), ("A100 80GB PCIe", 1.935e12),
                  ("A100", 1.555e12), ("L40S", 0.864e12))
"""Datasheet HBM bandwidth in bytes/s by device-name substring (first match wins)."""


def spec_bandwidth(device_name: str) -> float:
    """Datasheet bandwidth (bytes/s) of a device named ``device_name``; NaN when unknown."""
    for key, bw in SPEC_BANDWIDTH:
        if key.lower() in device_name.lower():
            return bw
    return math.nan


@dataclass(frozen=True)
class ModelCost:
    """Per-step byte and FLOP counts of one causal LM.

    ``weight_bytes``: bytes every decode step reads (all weights, the input embedding only
    when tied to the head); ``embed_row_bytes``: one gathered embedding row; ``kv_bytes_per_token``:
    K and V of one token over all layers; ``matmul_params``: parameters that do 2 FLOPs per token;
    ``attn_flops_per_ctx_token``: attention FLOPs per (query, context token) pair, all layers.
    """

    weight_bytes: int
    embed_row_bytes: int
    kv_bytes_per_token: int
    matmul_params: int
    attn_flops_per_ctx_token: int

    @classmethod
    def of(cls, model: torch.nn.Module, kv_dtype_bytes: int = 2) -> ModelCost:
        c = model.config
        emb = model.get_input_embeddings().weight
        head = model.get_output_embeddings()
        tied = head is not None and head.weight.data_ptr() == emb.data_ptr()
        params = list({id(p): p for p in model.parameters()}.values())
        untied_emb = [p for p in params if p is emb and not tied]
        weight_bytes = sum(p.numel() * p.element_size() for p in params) - sum(
            p.numel() * p.element_size() for p in untied_emb)
        matmul = sum(p.numel() for p in params if p.dim() >= 2 and (tied or p is not emb))
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        kv = c.num_hidden_layers * 2 * c.num_key_value_heads * head_dim * kv_dtype_bytes
        attn = 4 * c.num_hidden_layers * c.num_attention_heads * head_dim
        return cls(weight_bytes, emb.shape[1] * emb.element_size(), kv, matmul, attn)


def decode_schedule(prompt_lens: np.ndarray, lengths: np.ndarray, max_num_seqs: int) -> Iterator[tuple[int, int]]:
    """``(batch, context tokens read)`` of each step of a FIFO continuous-batching run: at most
    ``max_num_seqs`` sequences run at once, a finished one's slot goes to the next waiting one.
    Sequence ``i`` makes ``lengths[i]`` tokens; making its ``t``-th (from 0) reads
    ``prompt_lens[i] + t`` cached tokens."""
    prompt_lens = np.asarray(prompt_lens, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    nxt = min(n, max_num_seqs)
    idx = np.arange(nxt)
    done = np.zeros(nxt, dtype=np.int64)
    while len(idx):
        yield len(idx), int((prompt_lens[idx] + done).sum())
        done += 1
        keep = done < lengths[idx]
        idx, done = idx[keep], done[keep]
        free = min(max_num_seqs - len(idx), n - nxt)
        if free > 0:
            idx = np.concatenate([idx, np.arange(nxt, nxt + free)])
            done = np.concatenate([done, np.zeros(free, dtype=np.int64)])
            nxt += free


@dataclass(frozen=True)
class Floor:
    """Least seconds of a run: ``decode_s`` (each decode step at max(bytes / bw, FLOPs / peak)),
    ``prefill_s`` (prefill FLOPs / peak), ``decode_steps``; ``total_s`` is their sum."""

    decode_s: float
    prefill_s: float
    decode_steps: int

    @property
    def total_s(self) -> float:
        return self.decode_s + self.prefill_s


def run_floor(cost: ModelCost, prompt_lens: np.ndarray, lengths: np.ndarray, max_num_seqs: int, bandwidth: float,
              peak: float = PEAK_BF16) -> Floor:
    """The combined floor of generating ``lengths[i]`` tokens after each prompt ``prompt_lens[i]``."""
    decode_s, steps = 0.0, 0
    for b, ctx in decode_schedule(prompt_lens, lengths, max_num_seqs):
        nbytes = cost.weight_bytes + b * cost.embed_row_bytes + ctx * cost.kv_bytes_per_token
        flops = 2 * cost.matmul_params * b + cost.attn_flops_per_ctx_token * ctx
        decode_s += max(nbytes / bandwidth, flops / peak)
        steps += 1
    p = np.asarray(prompt_lens, dtype=np.float64)
    prefill_flops = 2 * cost.matmul_params * p.sum() + cost.attn_flops_per_ctx_token * (p * (p + 1) / 2).sum()
    return Floor(decode_s, prefill_flops / peak, steps)


def step_floor(cost: ModelCost, batch: int, context: int, bandwidth: float, peak: float = PEAK_BF16) -> float:
    """Floor seconds of one decode step of ``batch`` rows that each read ``context`` cached tokens."""
    nbytes = cost.weight_bytes + batch * cost.embed_row_bytes + batch * context * cost.kv_bytes_per_token
    return max(nbytes / bandwidth, (2 * cost.matmul_params * batch + cost.attn_flops_per_ctx_token * batch * context)
               / peak)

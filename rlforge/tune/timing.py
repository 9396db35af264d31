"""Predicted seconds of one RL step on one rank, from FLOPs and bytes at the device's rates (issue 39).

Rates: :class:`~rlforge.tune.device.DeviceSpec` ``flops`` (a large bf16 GEMM), ``bandwidth`` (a large
device copy), ``host_link`` (offload), ``peer_link`` (collectives); the micro-benchmark of
:mod:`rlforge.tune.bench` replaces the datasheet ones.  A stage costs ``FLOPs / flops + bytes /
bandwidth`` plus fixed costs:

* forward FLOPs per micro-batch of ``T`` tokens: ``2 * N_layers * T + 4 * L * n_q * d * T * s`` (attention
  over sequences of length ``s``) + the LM head's ``2 * V * h`` per response token; training = 3
  forwards, +1 layer forward with checkpointing, +1 head forward with the chunked head (recomputed in
  backward);
* elementwise bytes: the layer's saved activations written and read ``3 * T * L * a`` (liger's smaller
  ``a``, :func:`rlforge.tune.memory.layer_activation_bytes`, is its gain);
* ``reshard_after_forward``: the weights gathered again for backward, ``2P`` bytes over the peer link
  (a local copy on one rank) and ``2 * L`` more collective launches per micro-batch;
* a fixed :data:`MICRO_BATCH_S` per micro-batch (launch gaps, the host's batching work): the reason a
  larger token budget is faster;
* activation offload: each layer's checkpointed input to the host and back;
* ``optimizer_offload``: the moments over the host link twice per optimizer step; ``param_offload``:
  the master weights in per forward and backward, the gradients out;
* generation: every decode step reads the rollout's weights and the KV cache written so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlforge.tune.device import DeviceSpec
from rlforge.tune.levers import Levers
from rlforge.tune.memory import layer_activation_bytes, micro_tokens, trainable_params
from rlforge.tune.shapes import ModelShape
from rlforge.tune.workload import Workload

MICRO_BATCH_S = 0.03
"""Fixed seconds per micro-batch (host work, launch gaps); calibrate against a probe."""
LAUNCH_S = 20e-6
"""Seconds per extra collective launch (reshard's all-gathers)."""
WAKE_S = 1.0
"""Seconds to allocate the KV cache and capture the decode graphs when ``free_cache_engine`` frees them."""


@dataclass(frozen=True)
class StepTime:
    """Predicted seconds per stage (``stages``) and in all (``total``)."""

    stages: dict[str, float]

    @property
    def total(self) -> float:
        return float(sum(self.stages.values()))


def forward_flops(shape: ModelShape, tokens: float, seq_len: float, head_tokens: float) -> float:
    """FLOPs of one forward over ``tokens`` tokens in sequences of ``seq_len``; the head on ``head_tokens``."""
    n_layers = shape.layers * (shape.layer_params - 2 * shape.hidden)
    attn = 4.0 * shape.layers * shape.heads * shape.head_dim * tokens * seq_len
    return 2.0 * n_layers * tokens + attn + 2.0 * shape.vocab * shape.hidden * head_tokens


def _pass_time(shape: ModelShape, wl: Workload, lev: Levers, dev: DeviceSpec, budget: int, train: bool,
               rows: int) -> float:
    """Seconds of a forward (``train=False``) or forward+backward over ``rows`` rows in micro-batches."""
    lay = wl.layout
    tokens = float(rows * wl.seq_len)
    t_mb = micro_tokens(wl, lev, budget)
    n_micro = max(1, math.ceil(tokens / max(1, t_mb)))
    head_t = float(rows * wl.response_len) if lev.fused_kernels else tokens
    fwd = forward_flops(shape, tokens, wl.seq_len, head_t)
    layer_fwd = fwd - 2.0 * shape.vocab * shape.hidden * head_t
    flops = fwd
    if train:
        flops = 3 * fwd + (layer_fwd if lev.checkpointing else 0.0) + (fwd - layer_fwd if lev.fused_kernels else 0.0)
    elementwise = (3.0 if train else 1.0) * tokens * shape.layers * layer_activation_bytes(shape, lev.liger)
    seconds = flops / (dev.flops * lay.world) * lay.dp + elementwise / dev.bandwidth / (lay.tp * lay.pp)
    per_micro = MICRO_BATCH_S
    if lev.reshard and train:
        per_micro += 2.0 * shape.params / (dev.peer_link if lay.fsdp > 1 else dev.bandwidth)
        per_micro += 2 * shape.layers * LAUNCH_S
    if lev.activation_offload and lev.checkpointing and train:  # each layer's input out and back
        per_micro += 2 * 2.0 * shape.hidden * shape.layers * t_mb / dev.host_link
    if lev.param_offload:
        per_micro += (8.0 if train else 4.0) * shape.params / max(1, lay.fsdp) / dev.host_link
    return seconds + n_micro * per_micro


def optimizer_time(shape: ModelShape, wl: Workload, lev: Levers, dev: DeviceSpec) -> float:
    """One AdamW step on this rank's shard (and the moments over the host link when offloaded)."""
    p = trainable_params(shape, wl) / max(1, wl.layout.fsdp * wl.layout.tp * wl.layout.pp)
    seconds = 2 * 16.0 * p / dev.bandwidth
    if lev.optimizer_offload:
        seconds += 2 * 8.0 * p / dev.host_link
    return seconds


def gen_time(shape: ModelShape, wl: Workload, dev: DeviceSpec) -> float:
    """Generation: prefill FLOPs, then ``response_len`` decode steps each reading the weights and the KV cache."""
    prefill = forward_flops(shape, wl.rows * wl.prompt_len, wl.prompt_len, wl.rows) / dev.flops
    decode_flops = forward_flops(shape, wl.rows * wl.response_len, wl.seq_len, wl.rows * wl.response_len)
    kv_read = wl.rows * shape.kv_bytes_per_token() * (wl.prompt_len * wl.response_len + wl.response_len ** 2 / 2)
    weights_read = 2.0 * shape.params * wl.response_len
    return prefill + decode_flops / dev.flops + (kv_read + weights_read) / dev.bandwidth


def step_time(shape: ModelShape, wl: Workload, lev: Levers, dev: DeviceSpec,
              critic: ModelShape | None = None) -> StepTime:
    """Predicted seconds of each stage of one step (module doc)."""
    minis = max(1, math.ceil(wl.rows / wl.mini_rows))
    t = {"gen": gen_time(shape, wl, dev)}
    if wl.old_log_prob:
        t["old_log_prob"] = _pass_time(shape, wl, lev, dev, lev.log_prob_budget, False, wl.rows)
    if wl.ref:
        t["ref"] = _pass_time(shape, wl, lev, dev, lev.log_prob_budget, False, wl.rows)
    if wl.critic:
        c = critic or shape
        t["values"] = _pass_time(c, wl, lev, dev, lev.log_prob_budget, False, wl.rows)
        t["update_critic"] = (minis * _pass_time(c, wl, lev, dev, lev.token_budget, True, wl.mini_rows)
                              + minis * optimizer_time(c, wl, lev, dev))
    t["update_actor"] = (minis * _pass_time(shape, wl, lev, dev, lev.token_budget, True, wl.mini_rows)
                         + minis * optimizer_time(shape, wl, lev, dev))
    if lev.free_cache_engine:
        t["gen"] += WAKE_S  # the KV cache allocated and the CUDA graphs captured again every step
    return StepTime(t)

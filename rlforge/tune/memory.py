"""Peak device memory of one rank in each stage of an RL step, from the model's shapes (issue 39).

Bytes, per rank.  ``P`` parameters, shards over ``s = fsdp * tp * pp`` ranks (TP and PP split the
layers, FSDP the rest).  What each stage holds:

resident (every stage)
    the actor's master weights ``master_bytes * P / s`` (0 with ``param_offload``), its AdamW moments
    ``8 * P_train / s`` (0 with ``optimizer_offload``, ``P_train``: LoRA trains the adapter only), the
    rollout's full bf16 copy ``2 * P`` (each rank generates with its own), and the reference's and the
    critic's own resident weights and moments when they run.  The reference under LoRA is the actor
    itself (adapters off): nothing extra.
gen
    resident + the native engine's packed Q/K/V and gate/up copies (bf16, ``1/t`` of them with rollout TP)
    + its logits/sampling scratch ``2 * min(max_num_seqs, t * rows) * V * 4`` + the KV cache: every row of
    the rollout group (``t * rows``) at full length, ``1/min(t, kv_heads)`` of its heads, capped by
    ``gpu_memory_utilization * total - rollout weights - copies - scratch``
    (:meth:`rlforge.rollout.native.engine.NativeRollout._num_blocks`).  With ``free_cache_engine=false``
    the cache, copies and scratch stay allocated in every other stage too.
old_log_prob, ref, values, reward (forward only)
    resident + the gathered bf16 weights (every layer without ``reshard_after_forward``, else the root
    unit and two layers) + two layers' transient activations of one micro-batch + the LM head: one
    chunk of ``(chunk_size, V)`` bf16 logits and float32 statistics with the chunked head
    (``use_fused_kernels``), else the micro-batch's ``(T, V)`` logits in bf16 and float32.
update_actor, update_critic
    resident + gathered weights + float32 sharded gradients + the saved activations of one micro-batch of
    ``T`` tokens: ``T * L * a`` without checkpointing, ``T * L * 2h + T * a`` with it (each layer keeps its
    input and one layer is recomputed at a time) + the head (chunked: one chunk's logits and two float32
    buffers; else ``(T, V)`` bf16 logits and three float32 copies) + with ``optimizer_offload`` one 1 GiB
    chunk of moments during the step.

Saved activations of one decoder layer per token (bf16, flash/varlen attention, no ``(s, s)`` scores):
``a = 2 * (3h + 2 * kv) + 2h + 8f + 8h`` bytes (norm output, Q, K, V, attention output, MLP input,
gate, up, SiLU output and product (8f), the float32 copies inside two HF RMSNorms (8h)); with liger
(fused RMSNorm and SwiGLU, which recompute their intermediates) ``a = 2 * (3h + 2 * kv) + 2h + 6f + 4h``.
TP divides ``a`` by ``tp``.  Token count of a micro-batch: the token budget with dynamic batching, else
``ppo_micro_batch_size_per_gpu`` rows of full length.  The trainer reports
``perf/max_memory_allocated_gb/<stage>`` (1e9 bytes): :mod:`rlforge.tune.memcheck` compares the two.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlforge.tune.device import DeviceSpec
from rlforge.tune.levers import Levers
from rlforge.tune.shapes import ModelShape
from rlforge.tune.workload import Workload

GiB = float(2**30)
OFFLOAD_CHUNK = GiB
"""Optimizer-state bytes the offloaded AdamW brings to the device at once (engine/optim_offload.py)."""

STAGES = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor", "reward")


@dataclass
class StageMemory:
    """One stage's predicted peak: ``parts`` name -> bytes; ``total`` their sum."""

    stage: str
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return float(sum(self.parts.values()))


def layer_activation_bytes(shape: ModelShape, liger: bool) -> float:
    """Saved activation bytes of one decoder layer per token (module doc's ``a``)."""
    h, kv, f = shape.hidden, shape.kv_dim, shape.intermediate
    return 2 * (3 * h + 2 * kv) + 2 * h + (6 * f + 4 * h if liger else 8 * f + 8 * h)


def micro_tokens(wl: Workload, lev: Levers, budget: int, micro_rows: int = 4) -> int:
    """Tokens of one micro-batch: the budget under dynamic batching, else ``micro_rows`` full-length rows."""
    return int(budget) if lev.dynamic_bsz else micro_rows * wl.seq_len


def _shards(wl: Workload) -> int:
    lay = wl.layout
    return max(1, lay.fsdp * lay.tp * lay.pp)


def trainable_params(shape: ModelShape, wl: Workload) -> float:
    """Parameters the optimizer holds: LoRA's adapters (rank ``r`` on Q/K/V/O and the MLP) or all."""
    if wl.lora_rank <= 0:
        return float(shape.params)
    h, q, kv, f, r = shape.hidden, shape.heads * shape.head_dim, shape.kv_dim, shape.intermediate, wl.lora_rank
    per_layer = r * ((h + q) * 2 + (h + kv) * 2 + 3 * (h + f))
    return float(shape.layers * per_layer)


def resident(shape: ModelShape, wl: Workload, lev: Levers, critic: ModelShape | None = None) -> dict[str, float]:
    """Bytes every stage holds (module doc's "resident")."""
    s = _shards(wl)
    parts = {
        "actor weights": 0.0 if lev.param_offload else wl.master_bytes * shape.params / s,
        "actor optimizer": 0.0 if lev.optimizer_offload else 8 * trainable_params(shape, wl) / s,
        "rollout weights": 2.0 * shape.params / wl.layout.rollout_tp,
    }
    if wl.ref and wl.lora_rank <= 0 and not lev.ref_param_offload:
        parts["ref weights"] = wl.master_bytes * shape.params / s
    if wl.critic:
        c = critic or shape
        parts["critic weights"] = 0.0 if lev.param_offload else wl.master_bytes * c.params / s
        parts["critic optimizer"] = 0.0 if lev.optimizer_offload else 8.0 * c.params / s
    return parts


def gathered_bytes(shape: ModelShape, wl: Workload, lev: Levers) -> float:
    """The unsharded bf16 weights alive during a forward/backward (none on one rank without offload
    beyond the compute-dtype copy, which FSDP2 still all-gathers into)."""
    lay = wl.layout
    layers = shape.layers if not lev.reshard else min(2, shape.layers)
    return 2.0 * (shape.root_params + layers * shape.layer_params) / (lay.tp * lay.pp)


def head_bytes(shape: ModelShape, wl: Workload, lev: Levers, tokens: int, train: bool, vocab_head: bool) -> float:
    """The LM head's transient memory for a micro-batch of ``tokens`` (module doc); a value head: none."""
    if not vocab_head:
        return 0.0
    v = shape.vocab / wl.layout.tp
    if lev.fused_kernels and wl.strategy == "fsdp2":  # FSDP1 and megatron fall back to the full logits
        chunk = min(wl.chunk_size, tokens)
        return chunk * v * ((2 + 8) if train else (2 + 4))
    return tokens * v * ((2 + 12) if train else (2 + 4))


def activation_bytes(shape: ModelShape, wl: Workload, lev: Levers, tokens: int, train: bool) -> float:
    """Activations of one micro-batch of ``tokens`` (module doc)."""
    a = layer_activation_bytes(shape, lev.liger) / wl.layout.tp
    layers = shape.layers / wl.layout.pp
    edge = 4.0 * shape.hidden * tokens  # embedding output and final norm
    if not train:
        return 2 * a * tokens + edge
    if not lev.checkpointing:
        return layers * a * tokens + edge
    kept = 0.0 if lev.activation_offload else layers * 2.0 * shape.hidden * tokens
    return kept + a * tokens + edge


def gen_memory(shape: ModelShape, wl: Workload, lev: Levers, dev: DeviceSpec, res: dict[str, float]) -> StageMemory:
    """The ``gen`` stage (module doc)."""
    t = wl.layout.rollout_tp
    copies = 2.0 * shape.packed_params / t
    scratch = 2.0 * min(lev.max_num_seqs, wl.rows * t) * shape.vocab * 4
    # a rollout group of t ranks generates the rows of all t; each rank keeps 1/t of the KV heads (a KV head
    # is repeated where there are fewer KV heads than ranks)
    need = float(wl.rows * t * wl.seq_len * shape.kv_bytes_per_token()) / min(t, shape.kv_heads)
    cap = lev.gpu_memory_utilization * dev.memory_bytes - res["rollout weights"] - copies - scratch
    free = dev.memory_bytes - sum(res.values())
    kv = max(0.0, min(need, cap, 0.9 * free - scratch - copies))
    return StageMemory("gen", {**res, "packed rollout weights": copies, "sampling scratch": scratch, "KV cache": kv})


def stage_memory(shape: ModelShape, wl: Workload, lev: Levers, dev: DeviceSpec,
                 critic: ModelShape | None = None) -> dict[str, StageMemory]:
    """Every stage's predicted peak on one rank (only the stages that run)."""
    res = resident(shape, wl, lev, critic)
    out = {"gen": gen_memory(shape, wl, lev, dev, res)}
    if not lev.free_cache_engine:  # the KV cache, packed copies and scratch stay through training
        g = out["gen"].parts
        res = {**res, "idle rollout cache": g["KV cache"] + g["packed rollout weights"] + g["sampling scratch"]}
    s = _shards(wl)
    infer_t = micro_tokens(wl, lev, lev.log_prob_budget)
    train_t = micro_tokens(wl, lev, lev.token_budget)

    def forward(name: str, m: ModelShape, vocab_head: bool) -> StageMemory:
        return StageMemory(name, {**res, "gathered weights": gathered_bytes(m, wl, lev),
                                  "activations": activation_bytes(m, wl, lev, infer_t, False),
                                  "LM head": head_bytes(m, wl, lev, infer_t, False, vocab_head)})

    def update(name: str, m: ModelShape, vocab_head: bool) -> StageMemory:
        parts = {**res, "gathered weights": gathered_bytes(m, wl, lev),
                 "gradients": 0.0 if lev.param_offload else 4.0 * trainable_params(m, wl) / s,
                 "activations": activation_bytes(m, wl, lev, train_t, True),
                 "LM head": head_bytes(m, wl, lev, train_t, True, vocab_head)}
        if lev.optimizer_offload:
            parts["optimizer chunk"] = min(OFFLOAD_CHUNK, 8.0 * trainable_params(m, wl) / s)
        return StageMemory(name, parts)

    if wl.old_log_prob:
        out["old_log_prob"] = forward("old_log_prob", shape, True)
    if wl.ref:
        out["ref"] = forward("ref", shape, True)
    if wl.critic:
        out["values"] = forward("values", critic or shape, False)
        out["update_critic"] = update("update_critic", critic or shape, False)
    out["update_actor"] = update("update_actor", shape, True)
    return out


def peak(stages: dict[str, StageMemory]) -> StageMemory:
    """The stage with the largest total."""
    return max(stages.values(), key=lambda s: s.total)


def minimum_bytes(shape: ModelShape, wl: Workload) -> float:
    """The least any setting can need on one rank: the rollout's bf16 copy and one layer's gathered
    weights (everything else offloaded), for the "cannot fit" message."""
    return 2.0 * shape.params + 2.0 * (shape.root_params + shape.layer_params) / (wl.layout.tp * wl.layout.pp)

"""Tensor-parallel rollout (``rollout.tensor_model_parallel_size = T > 1``), Megatron style.

Layout of one decoder layer on rank ``r`` of a TP group of ``T`` ranks (``H`` query heads,
``KV`` key/value heads, head dimension ``D``, ``I`` MLP columns):

- ``q_proj``: rows ``[r*H/T*D, (r+1)*H/T*D)`` (heads ``r*H/T ..``), ``k_proj``/``v_proj``:
  rows ``[r*KV/T*D, (r+1)*KV/T*D)`` (with the bias rows, Qwen2); query head ``h`` reads KV
  head ``h // (H/KV)``, so contiguous blocks of both keep each GQA group on one rank.
- ``o_proj``: columns of the same heads; its bias (if any) on rank 0 only (zeros elsewhere).
- ``gate_proj``/``up_proj``: rows ``[r*I/T, (r+1)*I/T)``; ``down_proj``: those columns.
- one ``all_reduce`` (sum) of the ``o_proj`` output and one of the ``down_proj`` output per
  layer; plain tensors and :func:`torch.distributed.all_reduce`, no DTensor (DTensor in the
  decode loop was measured ~25% slower, issue 40).
- embedding, norms, Qwen3 ``q_norm``/``k_norm`` and the LM head are **replicated**: every rank
  computes the same full logits ``[B, V]`` and samples them itself with a generator seeded
  alike on the group (:func:`group_seed`), so no logits gather and no token broadcast is needed
  in a step (a vocab-split head would add an all-gather of ``[B, V]`` per step and break the
  tied embedding of small Qwen/Llama models; it saves ``(T-1)/T`` of ``V*hidden`` weights,
  0.5-1 GB per rank at 7B, not worth a collective per decode step here).

The rollout's own copy of the policy is sharded in place (:func:`shard_module_`): each rank
keeps only its slices, and the weight sync copies each rank only its slice of every
gathered tensor (:func:`copy_sliced`).  The trainer's gather of one full tensor at a time
from its shards is unchanged (transient: one tensor).

Prompts: a TP group generates the **union** of its ranks' prompts (:func:`gather_prompts`),
so the trainer's data split is unchanged and every prompt is generated once per group;
each rank gets back its own rows.  Groups are consecutive ranks ``[g*T, (g+1)*T)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from rlforge.batch import Batch
from rlforge.errors import ConfigError, RLForgeError

KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


@dataclass(frozen=True)
class TPGroup:
    """This rank's TP group: ``group`` (a process group), ``rank`` in it, ``size`` ranks,
    ``leader`` (the global rank of its rank 0)."""

    group: Any
    rank: int
    size: int
    leader: int


@dataclass(frozen=True)
class Slice:
    """This rank's part of one tensor: ``[start, stop)`` along ``dim``; ``zero``: a zero tensor
    of the full shape (a row-parallel bias on ranks other than 0)."""

    dim: int
    start: int
    stop: int
    zero: bool = False

    def of(self, full: torch.Tensor) -> torch.Tensor:
        """The local part of ``full`` (a view, or zeros)."""
        if self.zero:
            return torch.zeros_like(full)
        return full.narrow(self.dim, self.start, self.stop - self.start)


def check_tp_size(tp: int, num_heads: int, num_kv_heads: int, world: int) -> None:
    """Raises ConfigError (one line naming :data:`KEY`) when ``tp`` does not divide the world,
    the attention heads or the key/value heads."""
    if world % tp:
        raise ConfigError(f"{KEY}={tp} does not divide the {world} process(es) of this run "
                          "(trainer.nnodes x trainer.n_gpus_per_node); use a divisor of it")
    if num_heads % tp or num_kv_heads % tp:
        raise ConfigError(f"{KEY}={tp} does not divide the model's {num_heads} attention heads and "
                          f"{num_kv_heads} key/value heads; use a common divisor of both")


def new_tp_group(tp: int) -> TPGroup:
    """This rank's group of ``tp`` consecutive ranks (every rank creates every group, in order:
    a collective).  Raises ConfigError when ``tp`` does not divide the world."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if world % tp:
        raise ConfigError(f"{KEY}={tp} does not divide the {world} process(es) of this run "
                          "(trainer.nnodes x trainer.n_gpus_per_node); use a divisor of it")
    mine = None
    for g in range(world // tp):
        ranks = list(range(g * tp, (g + 1) * tp))
        pg = dist.new_group(ranks) if tp < world else dist.group.WORLD
        if rank in ranks:
            mine = TPGroup(pg, rank - g * tp, tp, g * tp)
    assert mine is not None
    return mine


def shard_rules(root: nn.Module, lm: nn.Module, rank: int, size: int) -> dict[str, Slice]:
    """``{parameter name in root: Slice}`` for the linears of ``lm``'s decoder layers (``lm`` is
    ``root`` or a module inside it); names absent are replicated.  See the module docstring."""
    c = lm.config
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    heads, kv = c.num_attention_heads, getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    per = {}
    for layer in lm.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        cols = {att.q_proj: heads * d, att.k_proj: kv * d, att.v_proj: kv * d,
                mlp.gate_proj: mlp.gate_proj.weight.shape[0], mlp.up_proj: mlp.up_proj.weight.shape[0]}
        for m, n in cols.items():
            per[m] = ("col", n)
        per[att.o_proj] = ("row", heads * d)
        per[mlp.down_proj] = ("row", mlp.down_proj.weight.shape[1])
    out: dict[str, Slice] = {}
    for name, m in root.named_modules():
        if m not in per:
            continue
        kind, n = per[m]
        lo, hi = rank * n // size, (rank + 1) * n // size
        prefix = f"{name}." if name else ""
        if kind == "col":
            out[prefix + "weight"] = Slice(0, lo, hi)
            if m.bias is not None:
                out[prefix + "bias"] = Slice(0, lo, hi)
        else:
            out[prefix + "weight"] = Slice(1, lo, hi)
            if m.bias is not None:
                out[prefix + "bias"] = Slice(0, 0, m.bias.shape[0], zero=rank != 0)
    return out


@torch.no_grad()
def shard_module_(root: nn.Module, rules: dict[str, Slice]) -> None:
    """Replace each parameter named in ``rules`` by its local part, in place (same Parameter objects)."""
    for name, rule in rules.items():
        p = root.get_parameter(name)
        p.data = rule.of(p.data).contiguous().clone()


@torch.no_grad()
def copy_sliced(params: Any, target: nn.Module, rules: dict[str, Slice]) -> None:
    """Copy ``(name, full tensor)`` pairs into the sharded ``target``, each rank only its slice
    (names ``target`` lacks are skipped): the weight sync of a TP rollout."""
    dest = target.state_dict()
    for name, t in params:
        if name in dest:
            rule = rules.get(name)
            dest[name].copy_(t if rule is None else rule.of(t))


def all_reduce_(x: torch.Tensor, tp: TPGroup) -> torch.Tensor:
    """``x`` summed over the group, in place (the one collective per attention / MLP block)."""
    dist.all_reduce(x, group=tp.group)
    return x


def gather_prompts(prompts: Batch, tp: TPGroup) -> tuple[Batch, int]:
    """The union of the group's prompt batches (``input_ids``/``attention_mask`` only,
    left-padded to the widest) and where this rank's rows start in it."""
    mine = (prompts["input_ids"].cpu(), prompts["attention_mask"].cpu())
    parts: list[Any] = [None] * tp.size
    dist.all_gather_object(parts, mine, group=tp.group)
    width = max(ids.shape[1] for ids, _ in parts)
    ids = torch.cat([F.pad(i, (width - i.shape[1], 0)) for i, _ in parts])
    mask = torch.cat([F.pad(m, (width - m.shape[1], 0)) for _, m in parts])
    offset = sum(i.shape[0] for i, _ in parts[: tp.rank])
    device = prompts["input_ids"].device
    return Batch.from_dict({"input_ids": ids.to(device), "attention_mask": mask.to(device)}), offset


def group_seed(tp: TPGroup) -> int:
    """A seed drawn by the group's rank 0 (torch's global RNG) and broadcast to the group."""
    s = torch.randint(0, 2**62, (1,)) if tp.rank == 0 else torch.zeros(1, dtype=torch.long)
    dist.broadcast(s, src=tp.leader, group=tp.group)
    return int(s)


def check_same_outputs(outputs: list[list[int]], tp: TPGroup) -> None:
    """Raises RLForgeError when the ranks of the group generated different tokens (compared by
    one checksum per rank: the group must compute bitwise-equal logits to sample alike)."""
    got: list[Any] = [None] * tp.size
    dist.all_gather_object(got, hash(tuple(map(tuple, outputs))), group=tp.group)
    if len(set(got)) != 1:
        raise RLForgeError("the tensor-parallel rollout group diverged: its ranks sampled different tokens "
                           f"(checksums {got}); set {KEY}=1 and report it")

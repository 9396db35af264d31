"""What one RL step asks of each rank, read from the config: rows, lengths, roles, layout.

Units: rows are sequences (prompt + response), lengths are tokens.  Per rank: the step's rows
(``data.train_batch_size * rollout.n``) spread over the data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlforge.config.root import uses_critic
from rlforge.config.validate import uses_ref


@dataclass(frozen=True)
class Layout:
    """How the ranks split the model: ``world = dp * tp * pp``; FSDP shards over ``fsdp`` ranks (``dp``
    unless ``fsdp_config.fsdp_size`` limits it)."""

    world: int = 1
    tp: int = 1
    pp: int = 1
    fsdp: int = 1
    nodes: int = 1
    rollout_tp: int = 1
    """``rollout.tensor_model_parallel_size``: ranks that generate with one model copy, split by heads."""

    @property
    def dp(self) -> int:
        return max(1, self.world // (self.tp * self.pp))

    def describe(self) -> str:
        roll = f", rollout TP {self.rollout_tp}" if self.rollout_tp > 1 else ""
        return f"{self.world} GPU{'s' if self.world != 1 else ''} (FSDP {self.fsdp} x TP {self.tp} x PP {self.pp}{roll})"


@dataclass(frozen=True)
class Workload:
    """One step of one rank.

    Attributes:
        rows: sequences generated per step on this rank; mini_rows: sequences per optimizer step on this rank.
        prompt_len, response_len: the maximum lengths (tokens).
        old_log_prob, ref, critic, reward_model: which stages run.
        lora_rank: 0 = full fine-tuning.
        master_bytes: bytes per parameter of the sharded master weights (4 = fp32).
        chunk_size: the chunked LM head's positions per chunk.
        layout: the ranks.
        strategy: the actor's engine.
    """

    rows: int
    mini_rows: int
    prompt_len: int
    response_len: int
    old_log_prob: bool = False
    ref: bool = False
    critic: bool = False
    reward_model: bool = False
    lora_rank: int = 0
    master_bytes: int = 4
    chunk_size: int = 2048
    layout: Layout = Layout()
    strategy: str = "fsdp2"

    @property
    def seq_len(self) -> int:
        return self.prompt_len + self.response_len


def layout_of(cfg: Any, gpus: int | None = None, nnodes: int | None = None) -> Layout:
    """The config's layout, or one for ``gpus`` GPUs in all over ``nnodes`` nodes (``rlforge tune --gpus``)."""
    t = cfg.trainer
    nodes = int(nnodes or t.nnodes)
    world = int(gpus) if gpus else int(t.nnodes) * int(t.n_gpus_per_node)
    actor = cfg.actor_rollout_ref.actor
    tp = pp = 1
    if actor.strategy == "megatron":
        tp, pp = int(actor.megatron.tensor_model_parallel_size), int(actor.megatron.pipeline_model_parallel_size)
    dp = max(1, world // (tp * pp))
    size = int(actor.fsdp_config.fsdp_size)
    return Layout(world, tp, pp, dp if size <= 0 else min(size, dp), nodes, users_rollout_tp(cfg, world))


def users_rollout_tp(cfg: Any, world: int) -> int:
    """The rollout's tensor-parallel size on ``world`` ranks (:func:`rlforge.config.rollout_tp.rollout_tp_size`,
    1 where it does not divide ``world``)."""
    from rlforge.config.rollout_tp import rollout_tp_size

    t = rollout_tp_size(cfg, world)
    return t if world % t == 0 else 1


def workload_of(cfg: Any, layout: Layout | None = None) -> Workload:
    """The step of ``cfg`` on one rank of ``layout`` (default: the config's own)."""
    from rlforge.trainer.on_policy import skips_old_log_prob

    lay = layout or layout_of(cfg)
    arr = cfg.actor_rollout_ref
    n = int(arr.rollout.n)
    mtype = str(arr.actor.fsdp_config.model_dtype).lower()
    return Workload(
        rows=max(1, int(cfg.data.train_batch_size) * n // lay.dp),
        mini_rows=max(1, int(arr.actor.ppo_mini_batch_size) * n // lay.dp),
        prompt_len=int(cfg.data.max_prompt_length), response_len=int(cfg.data.max_response_length),
        old_log_prob=not skips_old_log_prob(cfg), ref=uses_ref(cfg), critic=uses_critic(cfg),
        reward_model=bool(cfg.reward_model.enable), lora_rank=int(arr.model.lora_rank),
        master_bytes=2 if mtype in ("bf16", "bfloat16", "fp16", "float16") else 4,
        chunk_size=int(arr.model.fused_kernel_options.chunk_size), layout=lay, strategy=str(arr.actor.strategy),
    )

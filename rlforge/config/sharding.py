"""How one step's batch is shared between the ranks, and the checks of its sizes (torch-free).

One step trains on ``S = data.train_batch_size x rollout.n`` samples (prompt-major: the ``n``
responses of prompt ``p`` are samples ``p*n .. p*n+n-1``).  Three layouts, picked from the sizes:

- ``prompts`` (the world divides ``train_batch_size``, or one process): each rank takes an equal
  contiguous share of the *prompts* and generates all ``n`` responses of each, so every GRPO group
  sits whole on one rank.  This is rlforge's layout since the start, unchanged.
- ``samples`` (the world divides ``S`` but not ``train_batch_size``): each rank takes an equal
  contiguous share of the flattened prompt x ``n`` sample list, as verl dispatches samples to its
  data-parallel ranks.  A group may span ranks, so the advantage estimator runs on the whole
  batch, gathered on every rank (:mod:`rlforge.trainer.sample_shards`).
- ``replica_samples`` (``strategy=megatron`` where the world does not divide ``S`` but the
  data-parallel size ``D = world / (tp x pp)`` does): data-parallel replica ``d`` takes samples
  ``d*S/D .. (d+1)*S/D - 1``; each of its mini-batches is spread as evenly as possible over the
  ``tp x pp`` ranks of its model-parallel group, whose engine gathers them anyway
  (:meth:`rlforge.engine.megatron.engine.MegatronEngine._gather`).  Some ranks then hold no sample;
  they generate nothing for the step, still join every collective, and report no per-sample metric.

Source: verl's ``check_mutually_exclusive`` / ``real_train_batch_size % minimal_bsz`` checks
(``verl/utils/config.py``) and the normalisation ``ppo_mini_batch_size * rollout.n // dp`` of its
workers.  Deviation: rlforge asks that ``D`` divide ``ppo_mini_batch_size * rollout.n`` (verl
floors the quotient) so that no sample is dropped from a mini-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlforge.errors import ConfigError

__all__ = ["BatchLayout", "batch_layout", "check_batch_sharding", "data_parallel_size", "sample_indices"]

_ARR = "actor_rollout_ref"


def data_parallel_size(block: Any, strategy: str, world: int) -> int:
    """Data-parallel replicas of a role: ``world / (tp * pp)`` for ``strategy=megatron`` (its
    ``megatron`` block ``block``), else ``world`` (FSDP: every rank is a replica)."""
    if strategy != "megatron":
        return world
    mp = int(block.tensor_model_parallel_size) * int(block.pipeline_model_parallel_size)
    return max(1, world // max(1, mp))


@dataclass(frozen=True)
class BatchLayout:
    """The step's layout (see the module docstring).

    ``num_prompts``: ``data.train_batch_size``; ``n``: ``rollout.n``; ``world``: processes;
    ``dp``/``tp``/``pp``: the actor's data-parallel size and model-parallel sizes (1, 1 for FSDP);
    ``num_mini_batches``: optimizer steps per epoch (``train_batch_size / ppo_mini_batch_size``).
    """

    num_prompts: int
    n: int
    world: int
    dp: int
    tp: int = 1
    pp: int = 1
    num_mini_batches: int = 1

    @property
    def num_samples(self) -> int:
        return self.num_prompts * self.n

    @property
    def mode(self) -> str:
        """``prompts``, ``samples`` or ``replica_samples``."""
        if self.world == 1 or self.num_prompts % self.world == 0:
            return "prompts"
        return "samples" if self.num_samples % self.world == 0 else "replica_samples"


def batch_layout(cfg: Any, world: int) -> BatchLayout:
    """The layout of ``cfg`` on ``world`` processes (no checks: :func:`check_batch_sharding`)."""
    actor = cfg.actor_rollout_ref.actor
    mega = actor.strategy == "megatron"
    tp = int(actor.megatron.tensor_model_parallel_size) if mega else 1
    pp = int(actor.megatron.pipeline_model_parallel_size) if mega else 1
    bs, mini = int(cfg.data.train_batch_size), int(actor.ppo_mini_batch_size)
    return BatchLayout(num_prompts=bs, n=int(cfg.actor_rollout_ref.rollout.n), world=world,
                       dp=data_parallel_size(actor.megatron, actor.strategy, world), tp=tp, pp=pp,
                       num_mini_batches=max(1, bs // max(1, mini)))


def _roles(cfg: Any, uses_ref: bool, uses_critic: bool) -> list[tuple[str, Any, str]]:
    """``(key, megatron block, strategy)`` of every role with an engine in the run."""
    arr = cfg.actor_rollout_ref
    out = [(f"{_ARR}.actor", arr.actor.megatron, arr.actor.strategy)]
    if uses_ref:
        out.append((f"{_ARR}.ref", arr.ref.megatron, arr.actor.strategy))
    if uses_critic:
        out.append(("critic", cfg.critic.megatron, cfg.critic.strategy))
    return out


def check_batch_sharding(cfg: Any, world: int, source: str, uses_ref: bool, uses_critic: bool) -> list[str]:
    """Refuse sizes that cannot be shared evenly; return warnings (one line each).

    Raises:
        ConfigError: ``train_batch_size x rollout.n`` not divisible by a role's data-parallel size;
            ``ppo_mini_batch_size x rollout.n`` not divisible by it (sample layouts); a setting that
            needs each prompt's responses on one rank (DAPO's ``filter_groups``, FlowRL's
            ``group_norm`` reward) under a sample layout; ``replica_samples`` with an FSDP role or
            a critic whose mini-batch count differs from the actor's.
    """
    lay = batch_layout(cfg, world)
    if lay.mode == "prompts":
        _check_prompt_minis(cfg, world, source, uses_ref, uses_critic)
        return []
    bs, n, s = lay.num_prompts, lay.n, lay.num_samples
    head = (f"data.train_batch_size={bs} is not divisible by the {world} ranks ({source}), so each rank takes a "
            f"share of the {bs} x {_ARR}.rollout.n={n} = {s} samples")
    for key, block, strategy in _roles(cfg, uses_ref, uses_critic):
        dp = data_parallel_size(block, strategy, world)
        what = (f"the {dp} data-parallel replicas of {key}.megatron (world / tensor x pipeline sizes)"
                if strategy == "megatron" else f"the {world} ranks")
        if lay.mode == "replica_samples" and strategy != "megatron":
            raise ConfigError(f"{head}; {s} samples do not divide by the {world} ranks, which {key}.strategy="
                              f"{strategy} needs (only strategy=megatron spreads a replica's samples over its "
                              f"model-parallel ranks); make {s} a multiple of {world}")
        if s % dp:
            raise ConfigError(f"{head}, but {s} is not divisible by {what}; make data.train_batch_size x "
                              f"{_ARR}.rollout.n a multiple of {dp}")
        role = "critic" if key == "critic" else f"{_ARR}.actor"
        mini = _mini(cfg, role)
        if key != f"{_ARR}.ref" and (mini * n) % dp:
            raise ConfigError(f"{head}, but {role}.ppo_mini_batch_size x {_ARR}.rollout.n = {mini} x {n} = "
                              f"{mini * n} samples per mini-batch is not divisible by {what}; pick a "
                              f"ppo_mini_batch_size whose samples divide by {dp}")
        if lay.mode == "replica_samples" and key == "critic" and bs // max(1, mini) != lay.num_mini_batches:
            raise ConfigError(f"{head} unevenly; critic.ppo_mini_batch_size={mini} must then equal "
                              f"{_ARR}.actor.ppo_mini_batch_size={cfg.actor_rollout_ref.actor.ppo_mini_batch_size}")
    _refuse_whole_groups(cfg, head)
    if lay.mode == "replica_samples" and cfg.trainer.balance_batch:
        return [f"trainer.balance_batch=True: {head} unevenly (some ranks hold none), and the balancer keeps equal "
                "row counts per rank; the batch is not balanced (set trainer.balance_batch=False to silence this)"]
    return []


def _check_prompt_minis(cfg: Any, world: int, source: str, uses_ref: bool, uses_critic: bool) -> None:
    """Whole prompts per rank: each mini-batch's ``ppo_mini_batch_size x rollout.n`` samples must split evenly over
    the data-parallel ranks too (else a rank's share floors: more optimizer steps than asked, or none)."""
    n = int(cfg.actor_rollout_ref.rollout.n)
    for key, block, strategy in _roles(cfg, uses_ref, uses_critic):
        if key == f"{_ARR}.ref":
            continue
        dp = data_parallel_size(block, strategy, world)
        role = "critic" if key == "critic" else f"{_ARR}.actor"
        mini = _mini(cfg, role)
        if dp > 1 and (mini * n) % dp:
            raise ConfigError(f"{role}.ppo_mini_batch_size x {_ARR}.rollout.n = {mini} x {n} = {mini * n} samples per "
                              f"mini-batch do not divide by the {dp} data-parallel ranks ({source}); a rank's share would be "
                              f"floored (other optimizer steps than asked); pick a ppo_mini_batch_size whose samples "
                              f"divide by {dp}")


def _mini(cfg: Any, role: str) -> int:
    actor_mini = int(cfg.actor_rollout_ref.actor.ppo_mini_batch_size)
    if role == "critic":
        return int(cfg.critic.ppo_mini_batch_size or actor_mini)
    return actor_mini


def _refuse_whole_groups(cfg: Any, head: str) -> None:
    """Settings that read each prompt's whole group on one rank."""
    if cfg.algorithm.filter_groups.enable:
        raise ConfigError(f"algorithm.filter_groups.enable=True (DAPO dynamic sampling) keeps or drops whole prompt "
                          f"groups on each rank, but {head}; make data.train_batch_size a multiple of the ranks")
    pl = cfg.actor_rollout_ref.actor.policy_loss
    if pl.loss_mode == "flowrl" and pl.flowrl.reward == "group_norm":
        raise ConfigError(f"{_ARR}.actor.policy_loss.flowrl.reward=group_norm normalises each prompt's group inside "
                          f"the actor's batch, but {head}; set it to raw or make data.train_batch_size a multiple "
                          "of the ranks")


def sample_indices(lay: BatchLayout, rank: int) -> list[int]:
    """The sample positions (in ``0 .. S-1``) rank ``rank`` holds, in its row order.

    ``prompts`` and ``samples``: the contiguous share ``rank*S/world ..``.  ``replica_samples``:
    for each mini-batch ``j`` of its replica (``m = S / (D * num_mini_batches)`` samples), the
    ``i``-th of the ``g = tp * pp`` ranks of the model-parallel group (sorted by rank) takes
    ``m*i//g .. m*(i+1)//g - 1`` of it, so every rank holds the same share of every mini-batch
    (possibly none).  Ranks are placed on the ``("pp", "dp", "tp")`` mesh of
    :mod:`rlforge.engine.megatron.mesh`: replica ``(rank // tp) % dp``.
    """
    s = lay.num_samples
    if lay.mode != "replica_samples":
        per = s // lay.world
        return list(range(rank * per, (rank + 1) * per))
    d = (rank // lay.tp) % lay.dp
    group = sorted(r for r in range(lay.world) if (r // lay.tp) % lay.dp == d)
    i, g = group.index(rank), len(group)
    replica = s // lay.dp
    m = replica // lay.num_mini_batches
    out: list[int] = []
    for j in range(lay.num_mini_batches):
        base = d * replica + j * m
        out += range(base + m * i // g, base + m * (i + 1) // g)
    return out

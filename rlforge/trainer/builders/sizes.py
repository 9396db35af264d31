"""Per-step sizes of a job, from verl's batch-size keys: sequences per (mini/micro) batch, token
budgets, the number of RL steps."""

from __future__ import annotations

from typing import Any


def per_step_sizes(cfg: Any, world_size: int = 1) -> dict[str, int]:
    """Per-rank sequence counts derived from verl's prompt-count keys.

    ``ppo_mini_batch_size`` counts prompts and is multiplied by ``rollout.n``; micro-batch
    sizes count sequences.  An unset micro-batch size means one micro-batch per mini-batch.
    The deprecated global ``*_micro_batch_size`` keys count over all data-parallel ranks: divided by
    ``world_size``, as verl's workers do (``ppo_micro_batch_size //= world / sp``; at least 1).
    Mini-batches are split evenly over the ``world_size`` data-parallel ranks.
    """
    n = cfg.actor_rollout_ref.rollout.n
    actor = cfg.actor_rollout_ref.actor
    rollout = cfg.actor_rollout_ref.rollout
    ref = cfg.actor_rollout_ref.ref
    critic = cfg.critic
    dp = max(1, world_size)
    mini = actor.ppo_mini_batch_size * n // dp

    def per_gpu(value: int | None) -> int | None:
        return max(1, int(value) // dp) if value else None

    micro = actor.ppo_micro_batch_size_per_gpu or per_gpu(actor.ppo_micro_batch_size) or mini
    critic_mini = (critic.ppo_mini_batch_size or actor.ppo_mini_batch_size) * n // dp
    critic_micro = critic.ppo_micro_batch_size_per_gpu or per_gpu(critic.ppo_micro_batch_size) or critic_mini
    return {
        "actor_mini": mini,
        "actor_micro": micro,
        "log_prob_micro": rollout.log_prob_micro_batch_size_per_gpu or per_gpu(rollout.log_prob_micro_batch_size) or micro,
        "ref_micro": ref.log_prob_micro_batch_size_per_gpu or per_gpu(ref.log_prob_micro_batch_size) or micro,
        "critic_mini": critic_mini,
        "critic_micro": critic_micro,
        "critic_forward_micro": critic.forward_micro_batch_size_per_gpu
        or per_gpu(critic.forward_micro_batch_size) or critic_micro,
    }


def token_budgets(cfg: Any) -> dict[str, int | None]:
    """Token budgets per micro-batch (``*_max_token_len_per_gpu``) where dynamic batching is on
    (``use_dynamic_bsz`` / ``log_prob_use_dynamic_bsz``), else None."""
    arr, critic = cfg.actor_rollout_ref, cfg.critic

    def pick(on: bool, value: int) -> int | None:
        return int(value) if on else None

    return {
        "actor": pick(arr.actor.use_dynamic_bsz, arr.actor.ppo_max_token_len_per_gpu),
        "log_prob": pick(arr.rollout.log_prob_use_dynamic_bsz, arr.rollout.log_prob_max_token_len_per_gpu),
        "ref": pick(arr.ref.log_prob_use_dynamic_bsz, arr.ref.log_prob_max_token_len_per_gpu),
        "critic": pick(critic.use_dynamic_bsz, critic.ppo_max_token_len_per_gpu),
        "critic_forward": pick(critic.use_dynamic_bsz, critic.forward_max_token_len_per_gpu),
    }


def total_training_steps(cfg: Any, batches_per_epoch: int) -> int:
    """``trainer.total_training_steps`` if set, else ``total_epochs × batches per epoch``."""
    if cfg.trainer.total_training_steps is not None:
        return int(cfg.trainer.total_training_steps)
    return int(cfg.trainer.total_epochs) * batches_per_epoch

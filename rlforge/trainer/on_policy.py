"""Whether the ``old_log_prob`` stage can be skipped (``actor.recompute_old_log_prob``).

When one rollout batch feeds exactly one optimizer step, the "old" policy that PPO's ratio
compares against is the policy the update's own forward runs: its log-probs, detached, are the
old log-probs (verl's actor uses them so on-policy, ``dp_actor.py``), and a separate forward over
the whole batch before the update only recomputes them (verl issue #3996).  Skipping it saves one
forward pass per step (~20% of an e2e GRPO step, ``benchmarks/history/RESULTS-log.md``).
"""

from __future__ import annotations

from typing import Any

from rlforge.errors import ConfigError

_KEY = "actor_rollout_ref.actor.recompute_old_log_prob"


def on_policy_blockers(cfg: Any) -> list[str]:
    """Why the batch is not consumed on-policy by one optimizer step (empty when it is)."""
    actor = cfg.actor_rollout_ref.actor
    out = []
    if int(actor.ppo_epochs) != 1:
        out.append(f"actor_rollout_ref.actor.ppo_epochs={actor.ppo_epochs} (needs 1)")
    if int(actor.ppo_mini_batch_size) != int(cfg.data.train_batch_size):
        out.append(f"actor_rollout_ref.actor.ppo_mini_batch_size={actor.ppo_mini_batch_size} is not "
                   f"data.train_batch_size={cfg.data.train_batch_size} (more than one optimizer step per batch)")
    if bool(actor.calculate_sum_pi_squared):
        out.append("actor_rollout_ref.actor.calculate_sum_pi_squared=True reads the old policy's sum of squared "
                   "probabilities before the update")
    if bool(cfg.algorithm.use_kl_in_reward):
        out.append("algorithm.use_kl_in_reward=True reads the old log-probs before the update")
    rc = cfg.algorithm.rollout_correction
    if (rc.rollout_is is not None or rc.rollout_rs is not None) and not rc.bypass_mode:
        out.append("algorithm.rollout_correction (rollout_is/rollout_rs) compares the old log-probs with the "
                   "rollout's before the update")
    if actor.strategy == "megatron" and int(actor.megatron.pipeline_model_parallel_size) > 1:
        out.append("a pipeline-parallel actor (megatron.pipeline_model_parallel_size > 1) computes the "
                   "log-probs on its last stage only")
    return out


def skips_old_log_prob(cfg: Any) -> bool:
    """True when the trainer takes the old log-probs from the update's forward (never under
    ``algorithm.rollout_correction.bypass_mode``, which takes the rollout's).

    Raises ConfigError for ``recompute_old_log_prob=False`` when the batch is not on-policy."""
    choice = cfg.actor_rollout_ref.actor.recompute_old_log_prob
    if choice is True:
        return False
    if cfg.algorithm.rollout_correction.bypass_mode:
        return False
    blockers = on_policy_blockers(cfg)
    if choice is False and blockers:
        raise ConfigError(f"{_KEY}=False needs one optimizer step per rollout batch, but " + "; ".join(blockers)
                          + f". Set {_KEY}=null (skip it when possible) or true")
    return not blockers

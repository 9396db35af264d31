"""Per-step data and throughput metrics with verl's names.

``critic/score/*`` are per-sequence sums of ``token_level_scores``; ``critic/rewards/*``
the same for ``token_level_rewards`` (after any in-reward KL penalty);
``critic/advantages/*`` and ``critic/returns/*`` are over valid response tokens;
``response_length/clip_ratio`` is the fraction of responses that reached
``data.max_response_length``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.perf.flops import Convention, forward_flops, mfu, shared_prompt_flops, train_flops


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float()
    if x.numel() == 0:
        return {}
    return {f"{prefix}/mean": float(x.mean()), f"{prefix}/max": float(x.max()), f"{prefix}/min": float(x.min())}


def data_metrics(batch: Batch, max_response_length: int, max_prompt_length: int, use_critic: bool,
                 length_mask: torch.Tensor | None = None) -> dict[str, float]:
    """Score, reward, advantage, return, value and length statistics of one step's batch.
    ``length_mask``: ``(batch, response_len)`` mask the response lengths are counted from (the
    rollout's, before rollout correction's rejection); None = ``response_mask``."""
    mask = batch["response_mask"].bool()
    prompt_len = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(-1).float()
    resp_len = (mask if length_mask is None else length_mask.bool()).sum(-1).float()
    m: dict[str, float] = {}
    m.update(_stats("critic/score", batch["token_level_scores"].sum(-1)))
    m.update(_stats("critic/rewards", batch["token_level_rewards"].sum(-1)))
    m.update(_stats("critic/advantages", batch["advantages"][mask]))
    m.update(_stats("critic/returns", batch["returns"][mask]))
    if use_critic:
        values = batch["values"][mask]
        returns = batch["returns"][mask]
        m.update(_stats("critic/values", values))
        var_r = torch.var(returns)
        m["critic/vf_explained_var"] = float(1.0 - torch.var(returns - values) / (var_r + 1e-5))
    m.update(_stats("response_length", resp_len))
    m["response_length/clip_ratio"] = float((resp_len >= max_response_length).float().mean())
    m.update(_stats("prompt_length", prompt_len))
    m["prompt_length/clip_ratio"] = float((prompt_len >= max_prompt_length).float().mean())
    return m


def rollout_probs_diff_metrics(rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor,
                               response_mask: torch.Tensor) -> dict[str, float]:
    """verl's ``training/rollout_probs_diff_{max,mean,std}``: ``|p_rollout - p_actor|`` per valid
    response token, where ``p = exp(log-prob)``; all inputs ``(batch, response_len)``.  Shows how
    far the rollout engine's numerics drift from the trainer's (``rollout.calculate_log_probs``)."""
    mask = response_mask.bool()
    diff = (rollout_log_probs.float().exp() - old_log_probs.float().exp()).abs()[mask]
    if diff.numel() == 0:
        return {}
    return {
        "training/rollout_probs_diff_max": float(diff.max()),
        "training/rollout_probs_diff_mean": float(diff.mean()),
        "training/rollout_probs_diff_std": float(diff.std()) if diff.numel() > 1 else 0.0,
    }


def throughput_metrics(batch: Batch, step_time_s: float, num_gpus: int = 1) -> dict[str, float]:
    """``perf/total_num_tokens`` (prompt + response tokens), ``perf/time_per_step`` (s) and
    ``perf/throughput`` (tokens per second per GPU, or per process on CPU)."""
    total = float(batch["attention_mask"].sum())
    return {
        "perf/total_num_tokens": total,
        "perf/time_per_step": step_time_s,
        "perf/throughput": total / max(step_time_s, 1e-9) / max(num_gpus, 1),
    }


def tokens_per_hour(m: dict[str, float]) -> dict[str, float]:
    """``perf/tokens_per_hour``: prompt + response tokens of the whole job (all ranks) per hour
    of step wall time, from the rank-reduced ``perf/total_num_tokens`` (a sum) and
    ``timing_s/step`` (the slowest rank).  Validation and checkpoint time are not in the step."""
    step_s = m.get("timing_s/step", 0.0)
    if "perf/total_num_tokens" not in m or step_s <= 0:
        return {}
    return {"perf/tokens_per_hour": m["perf/total_num_tokens"] / step_s * 3600.0}


def mfu_metrics(
    m: dict[str, float], seqlens: list[int], actor_config: Any, critic_config: Any | None, ppo_epochs: int,
    critic_ppo_epochs: int, peak: float | None, num_devices: int = 1, *, recompute: bool = False,
    head_tokens: float | None = None, head_recompute: bool = False, saved_work: tuple[float, float] = (0.0, 0.0),
) -> dict[str, float]:
    """``perf/mfu/{actor,critic,ref}``, ``perf/mfu/actor_verl`` and ``perf/hfu/actor`` from the
    stage timings in ``m`` (fractions of the bf16 peak; :mod:`rlforge.perf.flops` has the formulas).

    ``seqlens``: prompt + response tokens of every sequence of the step (all ranks).
    Training counts forward + backward (3 forwards) per PPO epoch; ``ref`` one forward.
    ``perf/mfu/*`` use rlforge's convention, ``actor_verl`` verl's ``FlopsCounter`` (which also
    counts the embedding as a matmul); ``perf/hfu/actor`` the hardware FLOPs of the update:
    ``recompute`` (activation checkpointing of the actor's layers), ``head_tokens`` (positions
    whose logits the update computes; None = all) and ``head_recompute`` (the chunked LM head
    recomputes its forward in backward) as :func:`~rlforge.perf.flops.train_flops` takes them;
    ``saved_work``: ``(tokens, Σ s²)`` the update's shared-prompt layout did not compute
    (:data:`rlforge.engine.base.SAVED_TOKENS` of the actor update), whose FLOPs ``perf/hfu/actor`` does not
    count (``perf/mfu/*`` count the unshared rows: the work done for the user).
    Nothing is reported when the device peak is unknown (CPU).
    """
    out: dict[str, float] = {}
    if peak is None:
        return out

    def update(config: Any, epochs: int, convention: Convention) -> float:
        return epochs * train_flops(config, seqlens, convention, recompute, head_tokens=head_tokens,
                                    head_recompute=head_recompute)

    stages: list[tuple[str, str, Callable[[], float]]] = [
        ("mfu/actor", "timing_s/update_actor", lambda: update(actor_config, ppo_epochs, "rlforge")),
        ("mfu/actor_verl", "timing_s/update_actor", lambda: update(actor_config, ppo_epochs, "verl")),
        ("hfu/actor", "timing_s/update_actor", lambda: update(actor_config, ppo_epochs, "hfu")
         - shared_prompt_flops(actor_config, *saved_work, recompute=recompute)),
        ("mfu/ref", "timing_s/ref", lambda: forward_flops(actor_config, seqlens)),
    ]
    if critic_config is not None:
        stages.append(("mfu/critic", "timing_s/update_critic", lambda: update(critic_config, critic_ppo_epochs,
                                                                             "rlforge")))
    for name, key, flops in stages:
        if key not in m:
            continue
        value = mfu(flops(), m[key], peak, num_devices)
        if value is not None:
            out[f"perf/{name}"] = value
    return out

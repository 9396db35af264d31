"""Per-step data and throughput metrics with verl's names.

``critic/score/*`` are per-sequence sums of ``token_level_scores``; ``critic/rewards/*``
the same for ``token_level_rewards`` (after any in-reward KL penalty);
``critic/advantages/*`` and ``critic/returns/*`` are over valid response tokens;
``response_length/clip_ratio`` is the fraction of responses that reached
``data.max_response_length``.
"""

from __future__ import annotations

import torch

from rlforge.batch import Batch


def _stats(prefix: str, x: torch.Tensor) -> dict[str, float]:
    x = x.float()
    if x.numel() == 0:
        return {}
    return {f"{prefix}/mean": float(x.mean()), f"{prefix}/max": float(x.max()), f"{prefix}/min": float(x.min())}


def data_metrics(batch: Batch, max_response_length: int, max_prompt_length: int, use_critic: bool) -> dict[str, float]:
    """Score, reward, advantage, return, value and length statistics of one step's batch."""
    mask = batch["response_mask"].bool()
    prompt_len = batch["attention_mask"][:, : batch["prompts"].shape[1]].sum(-1).float()
    resp_len = mask.sum(-1).float()
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


def throughput_metrics(batch: Batch, step_time_s: float, num_gpus: int = 1) -> dict[str, float]:
    """``perf/total_num_tokens`` (prompt + response tokens), ``perf/time_per_step`` (s) and
    ``perf/throughput`` (tokens per second per GPU, or per process on CPU)."""
    total = float(batch["attention_mask"].sum())
    return {
        "perf/total_num_tokens": total,
        "perf/time_per_step": step_time_s,
        "perf/throughput": total / max(step_time_s, 1e-9) / max(num_gpus, 1),
    }

"""Validation: greedy (``rollout.val_kwargs``) generation over the whole validation set.

Logs ``val-core/<data_source>/reward/mean@<n>`` (verl's name), the mean score per data
source, with ``n = val_kwargs.n`` samples per prompt.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from rlforge.data import PromptLoader
from rlforge.rewards import RewardManager
from rlforge.rollout import Rollout, SamplingParams
from rlforge.trainer import spmd


def val_sampling_params(rollout_cfg: Any, max_response_length: int) -> SamplingParams:
    vk = rollout_cfg.val_kwargs
    return SamplingParams(
        temperature=float(vk.temperature), top_p=float(vk.top_p), top_k=int(vk.top_k),
        do_sample=bool(vk.do_sample), max_new_tokens=max_response_length,
    )


def validate(
    loader: PromptLoader, rollout: Rollout, reward: RewardManager, rollout_cfg: Any, max_response_length: int,
) -> dict[str, float]:
    """Score every validation prompt once (``val_kwargs.n`` samples each); return ``val-core/*`` metrics."""
    params = val_sampling_params(rollout_cfg, max_response_length)
    n = int(rollout_cfg.val_kwargs.n)
    scores: dict[str, list[float]] = defaultdict(list)
    rank, size = spmd.world()
    for prompts in loader:
        mine = prompts.select(np.arange(rank, len(prompts), size))  # this rank's rows
        if len(mine) == 0:
            continue
        batch = rollout.generate(mine.repeat_interleave(n), params)
        out = reward.score(batch)
        for src, s in zip(batch.non_tensor["data_source"], out.scores.tolist(), strict=True):
            scores[str(src)].append(float(s))
    merged: dict[str, list[float]] = defaultdict(list)
    for part in spmd.gather_objects(dict(scores)):
        for src, v in part.items():
            merged[src].extend(v)
    return {f"val-core/{src}/reward/mean@{n}": float(np.mean(v)) for src, v in merged.items()}

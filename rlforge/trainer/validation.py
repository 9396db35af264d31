"""Validation: greedy (``rollout.val_kwargs``) generation over the whole validation set.

Logs verl's validation metrics (:mod:`rlforge.trainer.val_metrics`) with ``N = val_kwargs.n``
responses per prompt: ``val-core/<data_source>/reward/mean@N`` and, for N > 1, ``best@N`` and ``maj@N``
(bootstrap ``/mean`` and ``/std``) in ``val-core``, ``std@N``, ``worst@k`` and the smaller k in ``val-aux``.
``maj@k`` votes over the reward function's ``pred`` extra key when it returns one, else over the
answer the data source's rule extracts (:func:`rlforge.rewards.extract_answer`; "" for none).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from rlforge.data import PromptLoader
from rlforge.rewards import RewardManager, extract_answer
from rlforge.rewards.rules import ANSWER_RULES
from rlforge.rollout import Rollout, SamplingParams
from rlforge.trainer import spmd
from rlforge.trainer.val_metrics import process_validation_metrics, validation_metric_names


def val_sampling_params(rollout_cfg: Any, max_response_length: int) -> SamplingParams:
    vk = rollout_cfg.val_kwargs
    return SamplingParams(
        temperature=float(vk.temperature), top_p=float(vk.top_p), top_k=int(vk.top_k),
        do_sample=bool(vk.do_sample), max_new_tokens=max_response_length,
    )


def validate(
    loader: PromptLoader, rollout: Rollout, reward: RewardManager, rollout_cfg: Any, max_response_length: int,
) -> dict[str, float]:
    """Score every validation prompt once (``val_kwargs.n`` samples each); return ``val-core/*`` and
    ``val-aux/*`` metrics (the ``@N`` metrics are computed per prompt, then averaged per data source)."""
    params = val_sampling_params(rollout_cfg, max_response_length)
    n = int(rollout_cfg.val_kwargs.n)
    rows: list[dict[str, Any]] = []
    rank, size = spmd.world()
    for b, prompts in enumerate(loader):
        mine = prompts.select(np.arange(rank, len(prompts), size))  # this rank's rows
        if len(mine) == 0 and not rollout.collective:
            continue
        batch = rollout.generate(mine.repeat_interleave(n), params)  # a TP group generates with no rows of its own too
        if len(mine) == 0:
            continue
        out = reward.score(batch)
        preds = out.extra_text.get("pred")
        for i, (src, s) in enumerate(zip(batch.non_tensor["data_source"], out.scores.tolist(), strict=True)):
            if preds is not None:
                pred: str | None = preds[i]
            elif str(src) in ANSWER_RULES:
                pred = extract_answer(str(src), out.decoded[i]) or ""  # "" = no answer, one more vote
            else:
                pred = None  # no answer rule for this data source: no maj@k
            row = {"uid": (rank, b, i // n), "data_source": str(src), "reward": float(s), "pred": pred}
            row.update({k: v[i] for k, v in out.extra.items() if k != "pred"})
            rows.append(row)
    merged = [r for part in spmd.gather_objects(rows) for r in part]
    if not merged:
        return {}
    keys = sorted({k for r in merged for k in r} - {"uid", "data_source"})
    infos = {k: [r.get(k, math.nan) for r in merged] for k in keys}
    return validation_metric_names(
        process_validation_metrics([r["data_source"] for r in merged], [r["uid"] for r in merged], infos)
    )

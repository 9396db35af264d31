"""DAPO dynamic sampling (Yu et al. 2025, "DAPO", §3.2, Eq. 11): keep only prompt groups
whose responses do not all get the same value of ``algorithm.filter_groups.metric``
(a group with zero spread has zero GRPO advantage and teaches nothing).

Metrics: ``acc`` (the reward function's ``acc`` extra key when it returns one, else
score > 0), ``score``/``seq_reward`` (the sequence score, sum of ``token_level_scores``),
``seq_final_reward`` (the same: in-reward KL is applied after filtering here).
"""

from __future__ import annotations

import numpy as np

from rlforge.batch import Batch
from rlforge.errors import ConfigError

METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


def sequence_metric(batch: Batch, metric: str | None) -> np.ndarray:
    """``(B,)`` float64 values of ``metric`` per response.

    Raises:
        ConfigError: unknown metric, naming ``algorithm.filter_groups.metric``.
    """
    metric = metric or "seq_reward"
    if metric not in METRICS:
        raise ConfigError(f"algorithm.filter_groups.metric={metric!r}: expected one of {', '.join(METRICS)}")
    score = batch["token_level_scores"].sum(-1).double().numpy()
    if metric == "acc":
        acc = batch.non_tensor.get("reward_extra/acc")
        return np.asarray(acc, dtype=np.float64) if acc is not None else (score > 0).astype(np.float64)
    return score


def kept_groups(uids: np.ndarray, values: np.ndarray) -> list[str]:
    """The group ids (in first-seen order) whose values are not all equal; size-1 groups are kept."""
    order: list[str] = []
    groups: dict[str, list[float]] = {}
    for u, v in zip(uids.tolist(), values.tolist(), strict=True):
        if u not in groups:
            order.append(u)
            groups[u] = []
        groups[u].append(v)
    return [u for u in order if len(groups[u]) == 1 or float(np.std(groups[u])) > 0]


def select_groups(batch: Batch, uids: list[str]) -> Batch:
    """The rows of ``batch`` whose ``uid`` is in ``uids``, in batch order."""
    wanted = set(uids)
    idx = [i for i, u in enumerate(batch.non_tensor["uid"].tolist()) if u in wanted]
    return batch.select(idx)

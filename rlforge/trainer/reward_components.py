"""The reward function's named components as per-sequence scores (``algorithm.adv_estimator=gdpo``).

A reward function that returns a dict (``{"score": ..., "accuracy_reward": ..., ...}``) has its
extra keys stored per sample in the batch's non-tensor field ``reward_extra/<key>``; GDPO
normalizes the ones named in ``algorithm.gdpo_reward_keys`` one by one
(:func:`rlforge.algorithms.compute_gdpo_outcome_advantage`).
"""

from __future__ import annotations

import numpy as np
import torch

from rlforge.batch import Batch
from rlforge.errors import RLForgeError


def reward_components(batch: Batch, keys: list[str] | None) -> dict[str, torch.Tensor]:
    """``{key: (B,) float32 score}`` for each of ``keys``, on the device of ``token_level_rewards``.

    Raises:
        RLForgeError: when ``keys`` is empty, a key is not among the reward function's returned keys,
            or a sample lacks it or holds a value that is not a finite number (one line naming the key
            and the first such sample).
    """
    if not keys:
        raise RLForgeError("algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward components "
                           "returned by the reward function (e.g. ['accuracy_reward', 'format_reward'])")
    device = batch["token_level_rewards"].device
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        field = f"reward_extra/{key}"
        if field not in batch.non_tensor:
            have = sorted(k.removeprefix("reward_extra/") for k in batch.non_tensor if k.startswith("reward_extra/"))
            raise RLForgeError(f"algorithm.gdpo_reward_keys names {key!r}, which the reward function did not return "
                               f"(its extra keys: {have or 'none'}); return a dict with {key!r} from compute_score")
        try:
            values = np.asarray(batch.non_tensor[field], dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise RLForgeError(f"reward component {key!r} (algorithm.gdpo_reward_keys) is not a number: {err}") from None
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise RLForgeError(f"reward component {key!r} (algorithm.gdpo_reward_keys) is missing or not finite for "
                               f"{bad.size} of {values.size} samples (first: sample {bad[0]}, value {values[bad[0]]})")
        out[key] = torch.as_tensor(values, dtype=torch.float32, device=device)
    return out


def gdpo_metrics(components: dict[str, torch.Tensor]) -> dict[str, float]:
    """verl's ``gdpo/<key>/{mean,std,max,min}`` of each component over the batch (std: population)."""
    m: dict[str, float] = {}
    for key, v in components.items():
        v = v.double()
        m.update({f"gdpo/{key}/mean": float(v.mean()), f"gdpo/{key}/std": float(v.std(unbiased=False)),
                  f"gdpo/{key}/max": float(v.max()), f"gdpo/{key}/min": float(v.min())})
    return m

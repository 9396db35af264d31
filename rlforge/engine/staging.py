"""Micro-batches staged on the device before the loop, and their metrics read back once.

Each host read of a device value waits for every queued kernel; the GPU then idles while
the host queues the next ones.  A training step used to make several such reads per
micro-batch: the pageable ``mb.to(device)`` copy, the boolean-mask indexing and ``int(max)``
of the padding-free packing, and ``float(loss)`` for the metrics.  The engines now

* compute each micro-batch's packing plan on the host and move all micro-batches of a step
  to the device before the first forward (:func:`stage`), and
* keep the loss functions' metrics as device tensors and read them all back in one copy
  after the last backward (:func:`metrics_to_floats`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.engine.packing import PACK_PLAN, PackPlan, with_pack_plan


def stage(micros: Sequence[Batch], device: torch.device, share_prompts: bool = False) -> list[Batch]:
    """``micros`` on ``device``, each with its packing plan (:class:`~rlforge.engine.packing.PackPlan`,
    the shared-prompt layout with ``share_prompts``) computed on the host first (micro-batches
    already on a device are moved unchanged)."""
    return [with_pack_plan(mb, share_prompts).to(device) for mb in micros]


def saved_work(micros: Sequence[Batch]) -> tuple[int, int]:
    """``(tokens, Σ s²)`` that the staged ``micros``' shared-prompt plans do not compute
    (:attr:`~rlforge.engine.packing.PackPlan.saved`, summed); ``(0, 0)`` without sharing."""
    tok = s2 = 0
    for mb in micros:
        plan = mb.meta.get(PACK_PLAN)
        if isinstance(plan, PackPlan):
            tok, s2 = tok + plan.saved[0], s2 + plan.saved[1]
    return tok, s2


def metrics_to_floats(per_micro: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """The micro-batch metric dicts with every value a Python float.

    Values may be floats, ints or one-element tensors (on any device); the tensors of one device
    are stacked and copied to the host together, one read per device for the whole step.

    Raises:
        ValueError: a tensor metric with more than one element (names the metric).
    """
    by_device: dict[torch.device, list[tuple[int, str, torch.Tensor]]] = defaultdict(list)
    out: list[dict[str, float]] = [{} for _ in per_micro]
    for i, m in enumerate(per_micro):
        for k, v in m.items():
            if isinstance(v, torch.Tensor):
                if v.numel() != 1:
                    raise ValueError(f"metric {k!r} is a tensor of shape {tuple(v.shape)}, not a scalar")
                by_device[v.device].append((i, k, v.detach().reshape(())))
            else:
                out[i][k] = float(v)
    for items in by_device.values():
        values = torch.stack([t.to(torch.float64) for _, _, t in items]).cpu().tolist()
        for (i, k, _), x in zip(items, values, strict=True):
            out[i][k] = float(x)
    return [{k: o[k] for k in m} for o, m in zip(out, per_micro, strict=True)]


def combine_micro_metrics(per_micro: Sequence[dict[str, Any]]) -> dict[str, float]:
    """One rank's step metrics from its micro-batches' (read back once, :func:`metrics_to_floats`):
    keys ending in ``loss`` are shares of the mini-batch loss and are summed; the rest are averaged."""
    acc: dict[str, list[float]] = defaultdict(list)
    for m in metrics_to_floats(per_micro):
        for k, v in m.items():
            acc[k].append(v)
    return {k: (sum(v) if k.endswith("loss") else sum(v) / len(v)) for k, v in acc.items()}

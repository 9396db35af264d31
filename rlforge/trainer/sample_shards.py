"""Which samples of a step this rank generates and trains on, and the advantages of a shared batch.

The layouts and their size rules are :mod:`rlforge.config.sharding`'s.  Under ``prompts`` (the world
divides ``data.train_batch_size``) each rank takes whole prompts and runs the estimator on its own
groups, as rlforge always did (bit-identical).  Under ``samples`` / ``replica_samples`` a prompt's
``n`` responses may sit on several ranks, so:

- every rank loads the same prompt batch and takes rank 0's uids, so the group ids agree;
- the advantage estimator runs on the whole batch: what it reads (rewards, masks, uids, values,
  baselines, old log-probs, reward components) is gathered on every rank, right-padded to the
  widest response, and each rank keeps its own rows and width.  Group statistics (GRPO's mean and
  std, RLOO's leave-one-out mean, pass@k, GDPO's per-component normalisation, the optimal-token
  baseline) are then those of whole groups, and batch whitening covers the whole batch, as in
  verl, whose driver computes advantages on the full batch;
- a rank that holds no sample (``replica_samples``) generates and scores one stand-in sample (the
  step's first), which it drops before training: it would otherwise idle while the others
  generate, and the rollout and reward code need no empty-batch path.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from rlforge.algorithms.advantages import AdvantageInputs
from rlforge.batch import Batch
from rlforge.config.sharding import BatchLayout, sample_indices
from rlforge.trainer import spmd

__all__ = ["StepShare", "StepSharding"]


@dataclass
class StepShare:
    """This rank's part of one step.

    ``samples``: one prompt row per sample this rank generates (``(rows, prompt_len)``; a stand-in
    of one row when ``empty``); ``prompts``: the distinct prompts those samples answer (for the
    greedy baseline of ``remax``); ``prompt_of_sample``: ``(rows,)`` position of each sample's
    prompt in ``prompts``; ``empty``: this rank holds no sample this step.
    """

    samples: Batch
    prompts: Batch
    prompt_of_sample: np.ndarray
    empty: bool = False


class StepSharding:
    """The step's layout on this rank (``rank`` of ``lay.world``)."""

    def __init__(self, lay: BatchLayout, rank: int) -> None:
        self.lay = lay
        self.rank = rank
        self.whole_prompts = lay.mode == "prompts"
        self.indices = np.asarray(sample_indices(lay, rank), dtype=np.int64)

    def take(self, batch: Batch) -> StepShare:
        """This rank's share of the loader's prompt batch ``batch`` (``train_batch_size`` prompts,
        the same on every rank), with a ``uid`` per prompt."""
        n = self.lay.n
        if self.whole_prompts:
            prompts = spmd.shard(batch)
            prompts.non_tensor["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(prompts))], dtype=object)
            return StepShare(prompts.repeat_interleave(n), prompts, np.repeat(np.arange(len(prompts)), n))
        uids = spmd.gather_objects([str(uuid.uuid4()) for _ in range(len(batch))])[0]  # rank 0's, on every rank
        batch.non_tensor["uid"] = np.array(uids, dtype=object)
        idx = self.indices if len(self.indices) else np.zeros(1, dtype=np.int64)
        owners, where = np.unique(idx // n, return_inverse=True)
        return StepShare(batch.select(idx // n), batch.select(owners), where, empty=not len(self.indices))

    def meta(self) -> dict[str, int]:
        """``num_mini_batches`` for the update under ``replica_samples`` (ranks hold different row
        counts, each the same share of every mini-batch: :func:`rlforge.roles.common.run_updates`)."""
        return {"num_mini_batches": self.lay.num_mini_batches} if self.lay.mode == "replica_samples" else {}

    def advantages(self, fn: Callable[[AdvantageInputs, Any], tuple[torch.Tensor, torch.Tensor]],
                   inputs: AdvantageInputs, alg: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """``fn(inputs, alg)``: on this rank's rows alone under ``prompts``, else on the whole
        gathered batch, returning this rank's rows ``(rows, response_len)`` of advantages and returns."""
        if self.whole_prompts:
            return fn(inputs, alg)
        full, start, width = _gather_inputs(inputs)
        adv, ret = fn(full, alg)
        rows = slice(start, start + inputs.response_mask.shape[0])
        device = inputs.response_mask.device
        return adv[rows, :width].to(device), ret[rows, :width].to(device)


_MATRICES = ("token_level_rewards", "response_mask", "values", "old_log_probs", "sum_pi_squared")


def _gather_inputs(inputs: AdvantageInputs) -> tuple[AdvantageInputs, int, int]:
    """Every rank's inputs concatenated in rank order (CPU; ``(B, R)`` fields right-padded with 0 to
    the widest ``R``), this rank's first row in them, and its own width ``R``."""
    mine: dict[str, Any] = {k: getattr(inputs, k) for k in (*_MATRICES, "index", "reward_baselines",
                                                             "reward_components")}
    mine = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in mine.items()}
    if mine["reward_components"] is not None:
        mine["reward_components"] = {k: torch.as_tensor(v).cpu() for k, v in mine["reward_components"].items()}
    parts = spmd.gather_objects(mine)
    rank = spmd.world()[0]
    start = sum(int(p["response_mask"].shape[0]) for p in parts[:rank])
    width = int(inputs.response_mask.shape[1])
    wide = max(int(p["response_mask"].shape[1]) for p in parts)
    out: dict[str, Any] = {}
    for k in _MATRICES:
        vals = [p[k] for p in parts]
        out[k] = None if vals[0] is None else torch.cat([F.pad(v, (0, wide - v.shape[1])) for v in vals])
    out["index"] = None if parts[0]["index"] is None else np.concatenate([p["index"] for p in parts])
    out["reward_baselines"] = (None if parts[0]["reward_baselines"] is None
                               else torch.cat([p["reward_baselines"] for p in parts]))
    comps = parts[0]["reward_components"]
    out["reward_components"] = None if comps is None else {
        k: torch.cat([p["reward_components"][k] for p in parts]) for k in comps}
    return AdvantageInputs(**out), start, width

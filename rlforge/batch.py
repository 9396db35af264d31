"""The batch object every stage of the RL step reads and writes.

A :class:`Batch` holds

* ``tensors``: a :class:`tensordict.TensorDict` whose entries all share the leading
  batch dimension, e.g. ``input_ids (batch, prompt_len + response_len)``,
  ``responses (batch, response_len)``, ``response_mask (batch, response_len)``,
  ``old_log_probs (batch, response_len)`` (float32, nats);
* ``non_tensor``: per-sample Python objects as 1-D ``numpy`` object arrays of the same
  length, e.g. ``data_source``, ``ground_truth``, ``extra_info``, ``uid`` (group id);
* ``meta``: batch-wide values (e.g. the sampling temperature used for the rollout).

Standard tensor keys (verl's names):
    prompts, responses, input_ids, attention_mask, position_ids, response_mask,
    token_level_scores, token_level_rewards, old_log_probs, ref_log_prob, values,
    advantages, returns, entropys.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict


def _as_object_array(values: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        arr[i] = v
    return arr


def _row_bound(value: Any) -> bool:
    """A ``meta`` value tied to this batch's rows (it has ``to_device``): moved by ``Batch.to``,
    dropped by ``Batch.select`` (it would describe the wrong rows)."""
    return callable(getattr(value, "to_device", None))


@dataclass
class Batch:
    """Token tensors of shape ``(batch, ...)`` plus per-sample non-tensor fields."""

    tensors: TensorDict
    non_tensor: dict[str, np.ndarray] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(
        cls,
        tensors: dict[str, torch.Tensor] | None = None,
        non_tensor: dict[str, Sequence[Any]] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> Batch:
        """Build a batch; all tensors and non-tensor lists must share their first dimension.

        Raises:
            ValueError: if the lengths differ.
        """
        tensors = tensors or {}
        non_tensor = {k: _as_object_array(v) for k, v in (non_tensor or {}).items()}
        sizes = {int(t.shape[0]) for t in tensors.values()} | {len(v) for v in non_tensor.values()}
        if len(sizes) > 1:
            raise ValueError(f"batch fields have different lengths: {sorted(sizes)}")
        n = sizes.pop() if sizes else 0
        td = TensorDict(dict(tensors), batch_size=[n])
        return cls(td, non_tensor, dict(meta or {}))

    def __len__(self) -> int:
        return int(self.tensors.batch_size[0]) if self.tensors.batch_dims else 0

    def __getitem__(self, key: str) -> torch.Tensor:
        return self.tensors[key]

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        self.tensors[key] = value

    def __contains__(self, key: str) -> bool:
        return key in self.tensors.keys() or key in self.non_tensor

    def select(self, index: torch.Tensor | np.ndarray | Sequence[int] | slice) -> Batch:
        """Return the rows in ``index`` (a slice, or integer indices), as a new batch."""
        if isinstance(index, slice):
            idx = np.arange(len(self))[index]
        else:
            idx = np.asarray(index.cpu() if isinstance(index, torch.Tensor) else index, dtype=np.int64)
        t_idx = torch.as_tensor(idx, dtype=torch.long)
        on: dict[torch.device, torch.Tensor] = {}

        def rows(t: torch.Tensor) -> torch.Tensor:
            # index_select, not t[t_idx]: on CPU advanced indexing costs ~6 ms per [512, 1280] field
            # (torch 2.11-2.13), which made the token-budget split of a GRPO batch take ~1-2 s
            i = on.get(t.device)
            if i is None:
                i = on[t.device] = t_idx.to(t.device)
            return t.index_select(0, i)

        return Batch(
            self.tensors.apply(rows, batch_size=[len(idx)]),
            {k: v[idx] for k, v in self.non_tensor.items()},
            {k: v for k, v in self.meta.items() if not _row_bound(v)},
        )

    def split(self, size: int) -> list[Batch]:
        """Consecutive chunks of ``size`` rows (the last may be smaller)."""
        return [self.select(slice(i, i + size)) for i in range(0, len(self), size)]

    def repeat_interleave(self, repeats: int) -> Batch:
        """Repeat every row ``repeats`` times in place: ``[a, b] -> [a, a, b, b]``."""
        idx = np.repeat(np.arange(len(self)), repeats)
        return self.select(idx)

    def union(self, other: Batch) -> Batch:
        """Add the fields of ``other`` (same length) to this batch, in place; returns self."""
        if len(other) != len(self):
            raise ValueError(f"cannot union batches of length {len(self)} and {len(other)}")
        for k in other.tensors.keys():
            self.tensors[k] = other.tensors[k]
        self.non_tensor.update(other.non_tensor)
        self.meta.update(other.meta)
        return self

    def to(self, device: torch.device | str) -> Batch:
        """Move the tensors to ``device``, and the ``meta`` values that have a ``to_device(device)``
        method (e.g. a packing plan); other non-tensor fields are unchanged."""
        meta = {k: (v.to_device(device) if _row_bound(v) else v) for k, v in self.meta.items()}
        return Batch(self.tensors.to(device), self.non_tensor, meta)

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Concatenate batches with the same keys along the batch dimension."""
        if not batches:
            raise ValueError("cannot concatenate an empty list of batches")
        td = torch.cat([b.tensors for b in batches], dim=0)
        keys = batches[0].non_tensor.keys()
        nt = {k: np.concatenate([b.non_tensor[k] for b in batches]) for k in keys}
        return Batch(td, nt, dict(batches[0].meta))

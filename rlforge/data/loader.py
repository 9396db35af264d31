"""Batches of left-padded prompts, with a seeded, resumable order.

Source: plays the role of verl's ``StatefulDataLoader`` + ``collate_fn`` for prompts, without
worker processes: prompts are already tokenized by :class:`rlforge.data.dataset.RLDataset`.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.errors import DataError


def collate_prompts(items: Sequence[dict[str, Any]], pad_token_id: int) -> Batch:
    """Stack dataset items into a :class:`Batch` of LEFT-padded prompts.

    Returns:
        Batch with tensors ``input_ids`` (B, P) long, padded on the left with
        ``pad_token_id`` to the longest prompt P in the batch; ``attention_mask`` (B, P)
        long (1 = real token); ``position_ids`` (B, P) = ``cumsum(mask) - 1`` clipped at 0;
        and non-tensor ``data_source``, ``ground_truth``, ``extra_info``, ``raw_prompt``,
        ``ability``, ``index`` (``extra_info['index']``).
    """
    if not items:
        raise ValueError("cannot collate an empty list of prompts")
    lengths = [int(it["input_ids"].numel()) for it in items]
    width = max(lengths)
    input_ids = torch.full((len(items), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(items), width), dtype=torch.long)
    for row, (it, n) in enumerate(zip(items, lengths, strict=True)):
        if n:
            input_ids[row, width - n :] = it["input_ids"]
            attention_mask[row, width - n :] = 1
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    non_tensor = {
        key: [it[key] for it in items]
        for key in ("data_source", "ground_truth", "extra_info", "raw_prompt", "ability")
    }
    non_tensor["index"] = [it["extra_info"]["index"] for it in items]
    return Batch.from_dict(
        {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}, non_tensor
    )


class PromptLoader:
    """Iterates :class:`Batch` objects of prompts, epoch after epoch, reproducibly.

    The order of epoch ``e`` is ``torch.randperm`` under a generator seeded with
    ``seed + e`` (or the dataset order when ``shuffle`` is false), so it depends only on
    ``(seed, epoch)``; together with :meth:`state_dict` this makes resuming exact.

    Args:
        dataset: anything with ``__len__``, ``__getitem__`` returning
            :class:`~rlforge.data.dataset.RLDataset` items, and ``pad_token_id``.
        batch_size: prompts per batch (``data.train_batch_size``).
        shuffle: ``data.shuffle``.
        seed: ``data.seed``.
        drop_last: drop the final incomplete batch of each epoch.
        batch_size_key: config key named in errors (``data.val_batch_size`` for validation).

    Raises:
        DataError: if ``batch_size`` exceeds the dataset size, or the dataset is empty.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 1,
        drop_last: bool = True,
        batch_size_key: str = "data.train_batch_size",
    ) -> None:
        n = len(dataset)
        if n == 0:
            source = getattr(dataset, "source_name", "the dataset")
            raise DataError(f"{source} has no prompts (its files have 0 rows, or every row was filtered out), "
                            f"so there is nothing to batch with {batch_size_key}")
        if batch_size <= 0:
            raise DataError(f"{batch_size_key} must be positive, got {batch_size}")
        if batch_size > n:
            raise DataError(
                f"{batch_size_key}={batch_size} is larger than the dataset ({n} prompts); "
                f"lower {batch_size_key} or add data"
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = int(seed)
        self.drop_last = drop_last
        self.pad_token_id = int(getattr(dataset, "pad_token_id", 0))
        self.epoch = 0
        self.position = 0  # batches already taken in ``epoch``

    def __len__(self) -> int:
        """Batches per epoch."""
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self, epoch: int) -> torch.Tensor:
        """Dataset indices of ``epoch`` in iteration order, shape ``(len(dataset),)``."""
        n = len(self.dataset)
        if not self.shuffle:
            return torch.arange(n)
        gen = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(n, generator=gen)

    def next_batch(self) -> Batch:
        """The next batch, rolling into the next epoch (``epoch += 1``) when this one is done.

        ``batch.meta`` holds ``epoch`` and ``batch_index`` (within the epoch).
        """
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0
        idx = self.order(self.epoch)[self.position * self.batch_size : (self.position + 1) * self.batch_size]
        batch = collate_prompts([self.dataset[int(i)] for i in idx], self.pad_token_id)
        batch.meta.update(epoch=self.epoch, batch_index=self.position)
        self.position += 1
        return batch

    def __iter__(self) -> Iterator[Batch]:
        """The remaining batches of the current epoch (or all of the next one, if it is done)."""
        if self.position >= len(self):
            self.epoch += 1
            self.position = 0
        while self.position < len(self):
            yield self.next_batch()

    def state_dict(self) -> dict[str, int]:
        """``{'epoch': int, 'position': int}``: where the next batch comes from."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume from :meth:`state_dict`.

        Raises:
            DataError: if ``epoch`` or ``position`` is missing or negative.
        """
        try:
            epoch, position = int(state["epoch"]), int(state["position"])
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"bad prompt-loader state {state!r}: need integer 'epoch' and 'position'") from e
        if epoch < 0 or position < 0:
            raise DataError(f"bad prompt-loader state {state!r}: epoch and position must be >= 0")
        self.epoch, self.position = epoch, position

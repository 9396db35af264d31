"""Decode masked token rows to text: the reward stage's, the judge's and the reward model's one decode.

The reward stage decodes every response of a step (e.g. 512 x 1,024 tokens) on the training process while
the GPU waits, so this is on the step's critical path.  Two costs dominate and both are avoidable:

- masking row by row (``r[m != 0].tolist()`` per row: one small tensor op per row); where each row's
  mask is a prefix of ones (a single-turn response: tokens, then padding) one ``tolist`` of the whole
  tensor and a slice per row give the same lists;
- ``batch_decode``'s Python wrapper around the tokenizers library: where the tokenizer is a fast one
  that does no clean-up of tokenization spaces, its backend's ``decode_batch`` gives the same strings.

Both fast paths are exact (same lists, same strings); anything else takes the plain path.
"""

from __future__ import annotations

from typing import Any

import torch


def masked_rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """The ids of each row of ``ids`` (B, T) where ``mask`` (B, T) is non-zero, as Python lists.

    Raises:
        ValueError: ``ids`` and ``mask`` differ in shape.
    """
    if ids.shape != mask.shape:
        raise ValueError(f"ids {tuple(ids.shape)} and mask {tuple(mask.shape)} differ in shape")
    ids, keep = ids.cpu(), mask.cpu() != 0
    if ids.numel() == 0:
        return [[] for _ in range(ids.shape[0])]
    lengths = keep.sum(-1)
    positions = torch.arange(ids.shape[-1])
    if bool((keep == (positions < lengths[:, None])).all()):  # every row: ones, then zeros
        return [row[:n] for row, n in zip(ids.tolist(), lengths.tolist(), strict=True)]
    return [r[m].tolist() for r, m in zip(ids, keep, strict=True)]


def decode_rows(tokenizer: Any, rows: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
    """``tokenizer.batch_decode(rows, skip_special_tokens=...)``, through the fast backend where that is exact."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if (backend is not None and hasattr(backend, "decode_batch")
            and getattr(tokenizer, "is_fast", False) and not getattr(tokenizer, "clean_up_tokenization_spaces", True)):
        return list(backend.decode_batch(rows, skip_special_tokens=skip_special_tokens))
    return list(tokenizer.batch_decode(rows, skip_special_tokens=skip_special_tokens))


def decode_masked(tokenizer: Any, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """Decode the tokens of ``ids`` (B, T) where ``mask`` (B, T) is non-zero, special tokens skipped."""
    return decode_rows(tokenizer, masked_rows(ids, mask))

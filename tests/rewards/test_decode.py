"""The reward stage's decode (rlforge.rewards.decode) against the plain per-row ``batch_decode``."""

from __future__ import annotations

import pytest
import torch

from rlforge.models import load_tokenizer
from rlforge.rewards.decode import decode_masked, decode_rows, masked_rows


def _plain(tok, ids: torch.Tensor, mask: torch.Tensor) -> list[str]:
    rows = [r[m != 0].tolist() for r, m in zip(ids, mask, strict=True)]
    return list(tok.batch_decode(rows, skip_special_tokens=True))


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("preset:tiny")


def test_masked_rows_hand_case() -> None:
    ids = torch.tensor([[5, 6, 7, 0], [8, 9, 0, 0], [1, 2, 3, 4]])
    prefix = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]])
    assert masked_rows(ids, prefix) == [[5, 6, 7], [8, 9], [1, 2, 3, 4]]
    holes = torch.tensor([[1, 0, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0]])  # multi-turn: tool tokens masked out
    assert masked_rows(ids, holes) == [[5, 7], [9, 0], []]
    assert masked_rows(ids[:, :0], prefix[:, :0]) == [[], [], []]
    with pytest.raises(ValueError, match="differ in shape"):
        masked_rows(ids, prefix[:, :2])


@pytest.mark.parametrize("holes", [False, True])
def test_decode_matches_batch_decode(tok, holes: bool) -> None:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, len(tok), (16, 40), generator=g)
    ids[:, 3] = tok.eos_token_id  # a special token, skipped by both
    lengths = torch.randint(0, 41, (16,), generator=g)
    mask = (torch.arange(40) < lengths[:, None]).long()
    if holes:
        mask[:, 5:9] = 0
    assert decode_masked(tok, ids, mask) == _plain(tok, ids, mask)
    assert decode_rows(tok, masked_rows(ids, mask)) == list(tok.batch_decode(masked_rows(ids, mask),
                                                                               skip_special_tokens=True))


def test_decode_falls_back_for_a_tokenizer_without_backend() -> None:
    class Slow:
        def batch_decode(self, rows, skip_special_tokens=True):
            return [",".join(map(str, r)) for r in rows]

    assert decode_masked(Slow(), torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1, 1], [1, 0]])) == ["1,2", "3"]

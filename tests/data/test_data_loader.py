"""PromptLoader: left padding, position ids, seeded shuffling, resuming."""

from __future__ import annotations

import pytest
import torch

from rlforge.data import PromptLoader, RLDataset, collate_prompts
from rlforge.errors import DataError


def make_dataset(tokenizer, n: int = 10) -> RLDataset:
    rows = [
        {
            "data_source": "rlforge/arithmetic",
            "prompt": [{"role": "user", "content": f"What is {i} + {'1' * (1 + i % 4)}?"}],
            "ability": "arithmetic",
            "reward_model": {"style": "rule", "ground_truth": str(i)},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]
    return RLDataset(rows, tokenizer, max_prompt_length=128)


def indices(batch) -> list[int]:
    return [int(i) for i in batch.non_tensor["index"]]


def test_left_padding_and_position_ids(smol_tokenizer) -> None:
    ds = make_dataset(smol_tokenizer, 4)
    items = [ds[0], ds[3]]  # prompts of different lengths
    n0, n3 = ds[0]["input_ids"].numel(), ds[3]["input_ids"].numel()
    assert n3 > n0
    batch = collate_prompts(items, pad_token_id=ds.pad_token_id)
    ids, mask, pos = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
    assert ids.shape == mask.shape == pos.shape == (2, n3)
    assert ids.dtype == mask.dtype == pos.dtype == torch.long
    pad = n3 - n0
    assert ids[0, :pad].tolist() == [smol_tokenizer.pad_token_id] * pad
    assert ids[0, pad:].tolist() == ds[0]["input_ids"].tolist()
    assert mask[0].tolist() == [0] * pad + [1] * n0 and mask[1].sum() == n3
    assert pos[0].tolist() == [0] * pad + list(range(n0))
    assert pos[1].tolist() == list(range(n3))
    assert list(batch.non_tensor["ground_truth"]) == ["0", "3"]
    assert list(batch.non_tensor["index"]) == [0, 3]
    assert set(batch.non_tensor) == {
        "data_source",
        "ground_truth",
        "extra_info",
        "raw_prompt",
        "ability",
        "index",
    }


def test_no_shuffle_order_and_len(smol_tokenizer) -> None:
    ds = make_dataset(smol_tokenizer, 10)
    loader = PromptLoader(ds, batch_size=4, shuffle=False, seed=0, drop_last=True)
    assert len(loader) == 2
    assert [indices(b) for b in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    keep = PromptLoader(ds, batch_size=4, shuffle=False, seed=0, drop_last=False)
    assert len(keep) == 3 and [len(b) for b in keep] == [4, 4, 2]


def test_seeded_shuffle(smol_tokenizer) -> None:
    ds = make_dataset(smol_tokenizer, 10)
    a = PromptLoader(ds, batch_size=5, shuffle=True, seed=7, drop_last=True)
    b = PromptLoader(ds, batch_size=5, shuffle=True, seed=7, drop_last=True)
    epoch0 = [indices(x) for x in a]
    assert epoch0 == [indices(x) for x in b]  # same seed, same order
    assert sorted(sum(epoch0, [])) == list(range(10))  # a permutation
    epoch1 = [indices(x) for x in a]
    assert a.epoch == 1 and epoch1 != epoch0  # a new order each epoch
    assert sorted(sum(epoch1, [])) == list(range(10))
    other = PromptLoader(ds, batch_size=5, shuffle=True, seed=8, drop_last=True)
    assert [indices(x) for x in other] != epoch0


def test_next_batch_rolls_over_and_resumes(smol_tokenizer) -> None:
    ds = make_dataset(smol_tokenizer, 10)
    loader = PromptLoader(ds, batch_size=3, shuffle=True, seed=3, drop_last=True)  # 3 batches/epoch
    seen = [loader.next_batch() for _ in range(4)]
    assert [b.meta["epoch"] for b in seen] == [0, 0, 0, 1]
    assert loader.state_dict() == {"epoch": 1, "position": 1}
    state = loader.state_dict()
    expected = [indices(loader.next_batch()) for _ in range(3)]
    resumed = PromptLoader(ds, batch_size=3, shuffle=True, seed=3, drop_last=True)
    resumed.load_state_dict(state)
    assert [indices(resumed.next_batch()) for _ in range(3)] == expected
    with pytest.raises(DataError, match="need integer 'epoch' and 'position'"):
        resumed.load_state_dict({"epoch": 1})


def test_batch_larger_than_dataset(smol_tokenizer) -> None:
    ds = make_dataset(smol_tokenizer, 4)
    with pytest.raises(DataError, match=r"data.train_batch_size=8 is larger than the dataset \(4 prompts\)"):
        PromptLoader(ds, batch_size=8, shuffle=True, seed=1, drop_last=True)
    with pytest.raises(DataError, match="data.val_batch_size=5"):
        PromptLoader(
            ds, batch_size=5, shuffle=False, seed=1, drop_last=False, batch_size_key="data.val_batch_size"
        )


def test_empty_dataset_names_its_files_key(smol_tokenizer) -> None:
    ds = RLDataset([], smol_tokenizer, max_prompt_length=128, source_name="data.val_files")
    with pytest.raises(DataError, match=r"^data.val_files has no prompts \(its files have 0 rows"):
        PromptLoader(ds, batch_size=2, batch_size_key="data.val_batch_size")

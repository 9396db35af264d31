"""Bad input to the native rollout gets one clear error naming the row or key, never a silent
wrong result: empty batches and rows, right-padded rows, token ids outside the vocabulary,
invalid sampling parameters, a KV cache that cannot be allocated, a weight replaced by a new
Parameter over the same storage, and the rollout config keys the engine does not read."""

from __future__ import annotations

import pytest
import torch

from rlforge.batch import Batch
from rlforge.config import load_config, validate_config
from rlforge.errors import ConfigError, RLForgeError
from rlforge.rollout import SamplingParams
from rlforge.rollout.native import NativeRollout
from rlforge.rollout.native.kv_cache import KVCache

CPU = torch.device("cpu")
GREEDY = SamplingParams(do_sample=False, max_new_tokens=5)


def _batch(ids: list[list[int]], mask: list[list[int]]) -> Batch:
    i, m = torch.tensor(ids), torch.tensor(mask)
    return Batch.from_dict({"input_ids": i, "attention_mask": m, "position_ids": (m.cumsum(1) - 1).clamp(min=0)})


def _engine(model, **kw) -> NativeRollout:
    return NativeRollout(model, [2], 0, CPU, progress=False, **kw)


@pytest.mark.parametrize(("ids", "mask", "match"), [
    ([[0, 5, 6], [0, 0, 0]], [[0, 1, 1], [0, 0, 0]], "prompt row 1 has no tokens"),
    ([[0, 0, 0], [0, 5, 6]], [[0, 0, 0], [0, 1, 1]], "prompt row 0 has no tokens"),
    ([[5, 6, 0], [0, 5, 6]], [[1, 1, 0], [0, 1, 1]], "prompt row 0 is not left-padded"),
    ([[0, 5, 6], [7, 10**6, 8]], [[0, 1, 1], [1, 1, 1]], "prompt row 1 holds token id 1000000 at column 1"),
    ([[0, 5, 6], [7, -3, 8]], [[0, 1, 1], [1, 1, 1]], "prompt row 1 holds token id -3"),
])
def test_bad_prompt_rows_name_the_row(model, ids, mask, match):
    with pytest.raises(ValueError, match=match):
        _engine(model).generate(_batch(ids, mask), GREEDY)


def test_empty_batch_is_an_error(model):
    empty = Batch.from_dict({k: torch.zeros(0, 3, dtype=torch.long) for k in ("input_ids", "attention_mask",
                                                                            "position_ids")})
    with pytest.raises(ValueError, match="empty batch"):
        _engine(model).generate(empty, GREEDY)


def test_padding_ids_outside_the_vocabulary_are_fine_when_masked(model):
    """Only the tokens under the mask are checked: a pad id of -1 in the padding is allowed."""
    out = _engine(model).generate(_batch([[-1, 5, 6], [7, 8, 9]], [[0, 1, 1], [1, 1, 1]]), GREEDY)
    assert out["responses"].shape == (2, 5)


@pytest.mark.parametrize(("kw", "match"), [
    ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1"),
    ({"max_new_tokens": -1}, "max_new_tokens"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"temperature": float("inf")}, "temperature"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": float("nan")}, "top_p"),
    ({"top_k": -5}, "top_k"),
])
def test_invalid_sampling_params(kw, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kw)


def test_kv_cache_that_cannot_be_allocated_is_one_error(model, monkeypatch):
    def fail(*a, **k):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 512 GB")

    monkeypatch.setattr(KVCache, "allocate", fail)
    with pytest.raises(RLForgeError, match=r"KV cache for 1 rows of up to 8 tokens needs .* GiB.*max_response_length"):
        _engine(model).generate(_batch([[5, 6, 7]], [[1, 1, 1]]), GREEDY)


def test_new_parameter_object_over_the_same_storage_is_picked_up(model):
    kept = _engine(model, free_cache_engine=False)
    batch = _batch([[0, 5, 6], [7, 8, 9]], [[0, 1, 1], [1, 1, 1]])
    before = kept.generate(batch, GREEDY)
    lin = model.model.layers[0].mlp.down_proj
    saved = lin.weight
    try:
        lin.weight = torch.nn.Parameter(saved.data)  # same storage, new object
        again = kept.generate(batch, GREEDY)
    finally:
        lin.weight = saved
    assert torch.equal(before["responses"], again["responses"])


BASE = ["actor_rollout_ref.model.path=preset:tiny", "data.train_batch_size=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2"]


def test_capture_sizes_must_be_a_list():
    with pytest.raises(ConfigError, match="cudagraph_capture_sizes"):
        validate_config(load_config([*BASE, "actor_rollout_ref.rollout.cudagraph_capture_sizes=8"]))


def test_train_batch_must_divide_over_ranks():
    with pytest.raises(ConfigError, match=r"data.train_batch_size=3 is not divisible by the 2 ranks"):
        validate_config(load_config([*BASE[:1], "data.train_batch_size=3", "actor_rollout_ref.actor.ppo_mini_batch_size=3",
                                     "trainer.n_gpus_per_node=2"]))


def test_rollout_keys_this_build_does_not_read_warn():
    warnings = validate_config(load_config([*BASE, "actor_rollout_ref.rollout.response_length=3",
                                            "actor_rollout_ref.rollout.prompt_length=2",
                                            "actor_rollout_ref.rollout.dtype=float16"]))
    text = "\n".join(warnings)
    assert "rollout.response_length=3" in text and "data.max_response_length" in text
    assert "rollout.prompt_length=2" in text and "rollout.dtype=float16" in text
    quiet = "\n".join(validate_config(load_config(BASE)))
    assert "response_length" not in quiet and "rollout.dtype" not in quiet

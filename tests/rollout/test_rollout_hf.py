"""``rollout.base.response_mask_from_eos`` by hand, and ``HFRollout`` against transformers'
``generate`` run on each prompt alone."""

from __future__ import annotations

import pytest
import torch

from rlforge.batch import Batch
from rlforge.models import load_causal_lm
from rlforge.rollout import SamplingParams
from rlforge.rollout.base import response_mask_from_eos
from rlforge.rollout.hf import HFRollout

EOS = 7


@pytest.fixture(scope="module")
def tiny_model(tiny_tokenizer):
    """preset:tiny with a wider init: with the default init (std 0.02) greedy decoding of the
    random model just repeats one token, which would make the comparisons below weak."""
    return load_causal_lm("preset:tiny", tiny_tokenizer, {"initializer_range": 0.2}, seed=1).eval()


def test_response_mask_from_eos_hand_case():
    responses = torch.tensor(
        [
            [5, 6, EOS, 8, EOS],  # EOS in the middle: ones up to and including the first EOS
            [5, 6, 9, 8, 4],  # no EOS: all ones
            [EOS, 6, 9, 8, 4],  # EOS first: only that token
            [5, 3, 9, 8, EOS],  # EOS last
        ]
    )
    expected = torch.tensor(
        [
            [1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1],
            [1, 0, 0, 0, 0],
            [1, 1, 1, 1, 1],
        ]
    )
    mask = response_mask_from_eos(responses, [EOS])
    assert mask.dtype == torch.int64
    assert torch.equal(mask, expected)
    # several EOS ids: whichever comes first ends the response
    assert torch.equal(response_mask_from_eos(torch.tensor([[5, 3, 6, EOS]]), [EOS, 3]), torch.tensor([[1, 1, 0, 0]]))


def _prompt_batch(tokenizer, texts: list[str]) -> tuple[Batch, list[list[int]]]:
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(x) for x in ids)
    pad = tokenizer.pad_token_id
    input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, x in enumerate(ids):
        input_ids[i, width - len(x):] = torch.tensor(x)
        mask[i, width - len(x):] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    batch = Batch.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": pos}, {"tag": ["a", "b"]})
    return batch, ids


TEXTS = ["What is 2 + 3?", "Compute the sum of seven and eleven, then subtract four from it please."]
MAX_NEW = 10


def _reference(model, prompt: list[int], eos_ids: list[int], pad_id: int) -> list[int]:
    """transformers greedy on the unpadded prompt, cut after the first EOS."""
    out = model.generate(
        input_ids=torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        do_sample=False, max_new_tokens=MAX_NEW, eos_token_id=eos_ids, pad_token_id=pad_id,
    )[0, len(prompt):].tolist()
    for j, t in enumerate(out):
        if t in eos_ids:
            return out[: j + 1]
    return out


def test_greedy_matches_transformers_generate_per_prompt(tiny_model, tiny_tokenizer):
    pad = tiny_tokenizer.pad_token_id
    batch, prompts = _prompt_batch(tiny_tokenizer, TEXTS)
    assert len(prompts[0]) != len(prompts[1])
    # A random model rarely emits the real EOS, so use a token that greedy decoding of the
    # first prompt emits (first at step j >= 2) as an extra EOS: that response then stops early.
    free = _reference(tiny_model, prompts[0], [tiny_tokenizer.eos_token_id], pad)
    j = next(j for j in range(2, len(free)) if free[j] not in free[:j])
    eos_ids = [tiny_tokenizer.eos_token_id, free[j]]

    rollout = HFRollout(tiny_model, eos_ids, pad, torch.device("cpu"), progress=False)
    out = rollout.generate(batch, SamplingParams(temperature=0, max_new_tokens=MAX_NEW))

    # documented keys, shapes and dtypes (rlforge/rollout/base.py)
    n, p_len = batch["input_ids"].shape
    r_len = out["responses"].shape[1]
    assert r_len <= MAX_NEW
    assert torch.equal(out["prompts"], batch["input_ids"])
    assert out["responses"].shape == out["response_mask"].shape == (n, r_len)
    assert out["response_mask"].dtype == torch.int64
    for k in ("input_ids", "attention_mask", "position_ids"):
        assert out[k].shape == (n, p_len + r_len), k
    assert torch.equal(out["input_ids"], torch.cat([batch["input_ids"], out["responses"]], 1))
    assert torch.equal(out["attention_mask"], torch.cat([batch["attention_mask"], out["response_mask"]], 1))
    valid = out["response_mask"].bool()
    expected_pos = batch["attention_mask"].sum(1, keepdim=True) + torch.arange(r_len)
    assert torch.equal(out["position_ids"][:, p_len:][valid], expected_pos[valid])
    assert list(out.non_tensor["tag"]) == ["a", "b"]

    ended = 0
    for i, prompt in enumerate(prompts):
        ref = _reference(tiny_model, prompt, eos_ids, pad)
        k = len(ref)
        assert out["responses"][i, :k].tolist() == ref, f"row {i}"
        assert out["response_mask"][i, :k].tolist() == [1] * k
        assert (out["response_mask"][i, k:] == 0).all()
        assert (out["responses"][i, k:] == pad).all()
        ended += ref[-1] in eos_ids and k < MAX_NEW
    assert ended >= 1  # the EOS path was exercised
    assert out["response_mask"][0].sum() == j + 1


def test_seeded_sampling_is_reproducible(tiny_model, tiny_tokenizer):
    batch, _ = _prompt_batch(tiny_tokenizer, TEXTS)
    rollout = HFRollout(tiny_model, [tiny_tokenizer.eos_token_id], tiny_tokenizer.pad_token_id,
                        torch.device("cpu"), progress=False)
    params = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=6)
    outs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        outs.append(rollout.generate(batch, params)["responses"])
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])


def test_micro_batched_greedy_equals_one_call(tiny_model, tiny_tokenizer):
    batch, _ = _prompt_batch(tiny_tokenizer, TEXTS)
    args = (tiny_model, [tiny_tokenizer.eos_token_id], tiny_tokenizer.pad_token_id, torch.device("cpu"))
    params = SamplingParams(do_sample=False, max_new_tokens=6)
    whole = HFRollout(*args, progress=False).generate(batch, params)
    split = HFRollout(*args, micro_batch_size=1, progress=False).generate(batch, params)
    assert torch.equal(whole["responses"], split["responses"])
    assert torch.equal(whole["response_mask"], split["response_mask"])

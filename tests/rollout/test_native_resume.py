"""Partial rollout in the native engine (``rlforge.rollout.native.resume``): a call stopped early keeps
each row's exact tokens, a later call continues them (also after a weight update, each token's
recorded log-prob matching a forward pass of the weights that sampled it), and the benchmark's
forced-EOS length hook (``rlforge.rollout.native.forced_eos``)."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import text_prompts

from rlforge.rollout import SamplingParams
from rlforge.rollout.native import NativeRollout
from rlforge.rollout.native.forced_eos import ENV, sample_indices
from rlforge.rollout.native.resume import Resume

TEXTS = ["What is 2 + 3?", "Compute the sum of seven and eleven, then subtract four please.", "Hi"]
MAX_NEW = 12
CPU = torch.device("cpu")


def _native(model, tok, **kw) -> NativeRollout:
    return NativeRollout(model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, ignore_eos=True,
                         calculate_log_probs=True, max_decode_burst=2, **kw)


def _stop_at(k: int):
    return lambda seqs: any(len(s.output_ids) >= k for s in seqs)


def test_greedy_stopped_then_resumed_equals_one_call(model, tiny_tokenizer):
    batch = text_prompts(tiny_tokenizer, TEXTS)
    greedy = SamplingParams(do_sample=False, max_new_tokens=MAX_NEW)
    eng = _native(model, tiny_tokenizer)
    full = eng.generate(batch, greedy)
    eng.generate(batch, greedy, Resume([[] for _ in TEXTS], stop=_stop_at(5)))
    first = [list(s.output_ids) for s in eng.last_sequences]
    assert all(not s.is_finished for s in eng.last_sequences)
    assert all(0 < len(o) < MAX_NEW for o in first)
    for o, row in zip(first, full["responses"].tolist(), strict=True):
        assert o == row[: len(o)]  # the stopped call's tokens are the prefix of the full one
    lps = [list(s.output_log_probs) for s in eng.last_sequences]
    out = eng.generate(batch, greedy, Resume(first, lps))
    assert torch.equal(out["responses"], full["responses"])
    assert torch.allclose(out["rollout_log_probs"], full["rollout_log_probs"], atol=1e-5)


def _token_log_probs(model, prompt: list[int], resp: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + resp])
    with torch.no_grad():
        logits = model(ids).logits.float()[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(resp)[:, None]).squeeze(1)


def test_per_version_log_probs_match_that_versions_weights(model, tiny_tokenizer):
    v0 = copy.deepcopy(model)
    v1 = copy.deepcopy(model)
    batch = text_prompts(tiny_tokenizer, TEXTS)
    params = SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW)
    eng = _native(v1, tiny_tokenizer, seed=3)
    with torch.no_grad():  # the engine runs v1's module: sample under v0's weights first
        saved = {k: t.clone() for k, t in v1.state_dict().items()}
        v1.load_state_dict(v0.state_dict())
    eng.generate(batch, params, Resume([[] for _ in TEXTS], stop=_stop_at(4)))
    first = [list(s.output_ids) for s in eng.last_sequences]
    lps = [list(s.output_log_probs) for s in eng.last_sequences]
    with torch.no_grad():  # "the update": new weights, in place
        v1.load_state_dict({k: t + 0.05 * torch.randn_like(t) if t.is_floating_point() else t
                            for k, t in saved.items()})
    eng.generate(batch, params, Resume(first, lps))
    for s, old in zip(eng.last_sequences, first, strict=True):
        assert s.output_ids[: len(old)] == old and len(s.output_ids) == MAX_NEW
        got = torch.tensor(s.output_log_probs)
        ref0 = _token_log_probs(v0, s.prompt_ids, s.output_ids)
        ref1 = _token_log_probs(v1, s.prompt_ids, s.output_ids)
        k = len(old)
        torch.testing.assert_close(got[:k], ref0[:k], atol=1e-5, rtol=0)
        torch.testing.assert_close(got[k:], ref1[k:], atol=1e-5, rtol=0)
        assert not torch.allclose(ref0[k:], ref1[k:], atol=1e-3)  # the two versions differ


def test_resume_rejects_a_finished_row(model, tiny_tokenizer):
    batch = text_prompts(tiny_tokenizer, TEXTS[:1])
    with pytest.raises(ValueError, match="row 0 already holds 12 tokens"):
        _native(model, tiny_tokenizer).generate(batch, SamplingParams(max_new_tokens=MAX_NEW), Resume([[5] * 12]))


def test_sample_indices_rank_rows_of_the_same_prompt():
    assert sample_indices([[1], [1], [2], [1], [2]], None) == [0, 1, 0, 2, 1]
    assert sample_indices([[1], [1]], [4, 7]) == [4, 7]


def test_forced_length_hook_imposes_lengths_and_eos(model, tiny_tokenizer, tmp_path, monkeypatch):
    hook = tmp_path / "lengths.py"
    hook.write_text("def length(prompt_ids, sample_index):\n    return 2 + 3 * sample_index + len(prompt_ids) % 2\n")
    monkeypatch.setenv(ENV, f"{hook}:length")
    batch = text_prompts(tiny_tokenizer, TEXTS).repeat_interleave(2)
    eng = NativeRollout(model, [tiny_tokenizer.eos_token_id], tiny_tokenizer.pad_token_id, CPU, progress=False)
    out = eng.generate(batch, SamplingParams(max_new_tokens=MAX_NEW))
    lengths = out["response_mask"].sum(1).tolist()
    for i, s in enumerate(eng.last_sequences):
        want = 2 + 3 * (i % 2) + len(s.prompt_ids) % 2
        assert lengths[i] <= want  # a sampled EOS may end it sooner (about 1 / vocab per token)
        assert int(out["responses"][i, lengths[i] - 1]) == tiny_tokenizer.eos_token_id
    monkeypatch.setenv(ENV, f"{hook}:missing")
    with pytest.raises(Exception, match="has no function 'missing'"):
        eng.generate(batch, SamplingParams(max_new_tokens=MAX_NEW))

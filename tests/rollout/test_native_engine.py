"""The native engine (``rlforge.rollout.native``) against ``HFRollout`` on ``preset:tiny``:
greedy parity (whole ``assemble``d batch), prefix sharing, preemption, chunked prefill,
in-place weight updates, and the sampler's distribution."""

from __future__ import annotations

import pytest
import torch
from helpers import text_prompts

from rlforge.batch import Batch
from rlforge.models import load_causal_lm
from rlforge.rollout import SamplingParams
from rlforge.rollout.hf import HFRollout
from rlforge.rollout.native import NativeRollout
from rlforge.rollout.native.kv_cache import KVCache
from rlforge.rollout.native.model_runner import ModelRunner, step_inputs
from rlforge.rollout.native.sampler import sample

TEXTS = [
    "What is 2 + 3?",
    "Compute the sum of seven and eleven, then subtract four from it please.",
    "Hi",
]
MAX_NEW = 12
GREEDY = SamplingParams(do_sample=False, max_new_tokens=MAX_NEW)
CPU = torch.device("cpu")


def _batch(tok, texts: list[str]) -> Batch:
    b = text_prompts(tok, texts)
    return Batch.from_dict({k: b[k] for k in b.tensors.keys()}, {"tag": [str(i) for i in range(len(texts))]})


def _eos_ids(model, tok, batch) -> list[int]:
    """The real EOS plus a token greedy decoding of row 0 emits at step >= 2, so that row ends early."""
    hf = HFRollout(model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False).generate(batch, GREEDY)
    free = hf["responses"][0].tolist()
    j = next(j for j in range(2, len(free)) if free[j] not in free[:j])
    return [tok.eos_token_id, free[j]]


def _assert_same(a: Batch, b: Batch) -> None:
    for k in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(a[k], b[k]), k
    assert list(a.non_tensor["tag"]) == list(b.non_tensor["tag"])


@pytest.fixture(scope="module")
def setup(model, tiny_tokenizer):
    tok = tiny_tokenizer
    batch = _batch(tok, TEXTS)
    eos = _eos_ids(model, tok, batch)
    ref = HFRollout(model, eos, tok.pad_token_id, CPU, progress=False).generate(batch, GREEDY)
    assert ref["response_mask"][0].sum() < MAX_NEW  # the EOS path is exercised
    return batch, eos, ref


def _native(model, tok, eos, **kw) -> NativeRollout:
    return NativeRollout(model, eos, tok.pad_token_id, CPU, progress=False, **kw)


def test_greedy_matches_hf_rollout(model, tiny_tokenizer, setup):
    batch, eos, ref = setup
    out = _native(model, tiny_tokenizer, eos, block_size=4).generate(batch, GREEDY)
    _assert_same(out, ref)


def test_prefix_sharing_same_outputs_fewer_blocks(model, tiny_tokenizer, setup):
    batch, eos, _ = setup
    rep = batch.repeat_interleave(4)
    ref = HFRollout(model, eos, tiny_tokenizer.pad_token_id, CPU, progress=False).generate(rep, GREEDY)
    shared = _native(model, tiny_tokenizer, eos, block_size=4)
    plain = _native(model, tiny_tokenizer, eos, block_size=4, enable_prefix_caching=False)
    a, b = shared.generate(rep, GREEDY), plain.generate(rep, GREEDY)
    _assert_same(a, ref)
    _assert_same(b, ref)
    assert shared.last_stats.prefix_hit_blocks > 0
    assert plain.last_stats.prefix_hit_blocks == 0
    assert shared.last_stats.blocks_allocated < plain.last_stats.blocks_allocated
    assert shared.last_stats.peak_blocks_in_use < plain.last_stats.peak_blocks_in_use


def test_preemption_keeps_greedy_outputs(model, tiny_tokenizer, setup):
    batch, eos, ref = setup
    longest = int(batch["attention_mask"].sum(1).max()) + MAX_NEW
    engine = _native(model, tiny_tokenizer, eos, block_size=4, num_blocks=-(-longest // 4) + 2)
    _assert_same(engine.generate(batch, GREEDY), ref)
    assert engine.last_num_preemptions > 0


def test_cache_too_small_for_one_sequence_raises(model, tiny_tokenizer, setup):
    from rlforge.errors import RLForgeError

    batch, eos, _ = setup
    with pytest.raises(RLForgeError, match="num_blocks"):
        _native(model, tiny_tokenizer, eos, block_size=4, num_blocks=3).generate(batch, GREEDY)


def test_chunked_prefill_same_outputs(model, tiny_tokenizer, setup):
    batch, eos, ref = setup
    engine = _native(model, tiny_tokenizer, eos, block_size=4, max_num_batched_tokens=5, max_num_seqs=2)
    _assert_same(engine.generate(batch.repeat_interleave(2), GREEDY),
                 HFRollout(model, eos, tiny_tokenizer.pad_token_id, CPU, progress=False).generate(
                     batch.repeat_interleave(2), GREEDY))


def test_in_place_weight_update_is_seen(tiny_tokenizer, setup):
    batch, eos, _ = setup
    model = load_causal_lm("preset:tiny", tiny_tokenizer, {"initializer_range": 0.2}, seed=0).eval()
    engine = _native(model, tiny_tokenizer, eos, block_size=4)
    hf = HFRollout(model, eos, tiny_tokenizer.pad_token_id, CPU, progress=False)
    before = engine.generate(batch, GREEDY)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight.mul_(-3.0)
        model.model.norm.weight.mul_(1.5)
    after = engine.generate(batch, GREEDY)
    assert not torch.equal(before["responses"], after["responses"])
    _assert_same(after, hf.generate(batch, GREEDY))


def test_seeded_sampling_reproducible(model, tiny_tokenizer, setup):
    batch, eos, _ = setup
    params = SamplingParams(temperature=0.8, top_p=0.9, top_k=20, max_new_tokens=6)
    outs = [_native(model, tiny_tokenizer, eos, seed=s).generate(batch, params)["responses"] for s in (3, 3, 4)]
    assert torch.equal(outs[0], outs[1])
    assert not torch.equal(outs[0], outs[2])


def test_first_token_samples_follow_softmax(model, tiny_tokenizer):
    ids = tiny_tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        probs = model(torch.tensor([ids])).logits[0, -1].float().softmax(-1)
    # the runner's logits for the same context agree with transformers'
    spec_runner = ModelRunner(model, KVCache.allocate(2, 4, 8, 2, 16, torch.float32, CPU))
    n = len(ids)
    inp = step_inputs(ids, list(range(n)), list(range(n)), [0], [n], [n], [list(range(-(-n // 8)))], [n - 1], [0],
                      CPU, 8)
    logits = spec_runner.run(inp)[0]
    torch.testing.assert_close(logits.softmax(-1), probs, atol=1e-5, rtol=1e-4)
    # the sampler on the first 8192 logits (a draw costs O(vocab), so the whole 49k vocabulary
    # takes ~15 s): they are split into 10 bins of about equal probability (tokens sorted by
    # probability), and the histogram of draws over those bins must match within sampling noise
    logits, probs = logits[..., :8192], logits[..., :8192].double().softmax(-1).float()
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(temperature=1.0, max_new_tokens=1)
    draws = torch.cat([sample(logits.expand(500, -1), params, g) for _ in range(12)])
    p_sorted, order = probs.sort(descending=True)
    bins = torch.empty_like(order)
    bins[order] = ((p_sorted.cumsum(0) - p_sorted) * 10).long().clamp(max=9)
    want = torch.zeros(10).index_add_(0, bins, probs)
    got = torch.bincount(bins[draws], minlength=10).float() / draws.numel()
    assert (want > 0.05).all()  # every bin carries real mass
    tv = 0.5 * (got - want).abs().sum().item()
    assert tv < 0.04, (tv, want, got)


def test_top_k_top_p_restrict_support():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    k = sample(logits.expand(2000, -1), SamplingParams(top_k=2, max_new_tokens=1), g)
    assert set(k.tolist()) == {0, 1}
    p = sample(logits.expand(2000, -1), SamplingParams(top_p=0.5, max_new_tokens=1), g)
    assert set(p.tolist()) == {0}  # p(token 0) = 0.64 >= 0.5


@pytest.mark.e2e
def test_native_rollout_from_the_cli(tmp_path):
    """``rollout.name=native`` trains one step through the real trainer on the distribution task:
    continuous rewards, so the update moves the policy; no fallback warning is printed."""
    import json

    from rlforge.cli import main

    rc = main([
        "train", "actor_rollout_ref.model.path=preset:tiny", "actor_rollout_ref.model.tokenizer_path=builtin:integers",
        "actor_rollout_ref.rollout.name=native", "data.train_files=builtin:distribution", "data.val_files=null",
        "data.max_prompt_length=16", "data.max_response_length=1", "data.train_batch_size=2",
        "data.builtin.train_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "trainer.total_training_steps=1", "trainer.logger=[file]", f"trainer.default_local_dir={tmp_path}",
    ])
    assert rc == 0
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["response_length/mean"] == 1.0 and row["actor/grad_norm"] > 0
    assert "timing_s/gen" in row


@pytest.mark.e2e
def test_native_rollout_reports_rollout_metrics(tmp_path):
    """The trainer logs the engine's ``rollout/*`` metrics; with n=4 samples per prompt the
    prompt blocks are shared (prefix hits > 0) and nothing is preempted in a full-size cache."""
    import json

    from rlforge.cli import main

    assert main([
        "train", "actor_rollout_ref.model.path=preset:tiny", "actor_rollout_ref.rollout.name=native",
        "data.train_batch_size=2", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "data.max_response_length=4", "data.builtin.train_size=4", "trainer.total_training_steps=1",
        "trainer.val_before_train=false", "trainer.logger=[file]", f"trainer.default_local_dir={tmp_path}",
    ]) == 0
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert row["rollout/output_tokens_per_s"] > 0
    assert row["rollout/num_preemptions"] == 0
    assert 0 < row["rollout/kv_cache_peak_usage"] <= 1
    assert 0 < row["rollout/batch_occupancy"] <= 1
    assert row["rollout/prefix_hit_blocks"] > 0


def test_decode_step_writes_logits_into_out(model, tiny_tokenizer):
    """``ModelRunner.decode(d, out=buf)`` (what the CUDA graphs capture) fills ``buf`` with the
    same logits as ``decode(d)``, and both equal transformers' forward at the new position."""
    from rlforge.rollout.native.model_runner import DecodeInputs

    ids = tiny_tokenizer("What is 2 + 3?", add_special_tokens=False)["input_ids"]
    runner = ModelRunner(model, KVCache.allocate(2, 4, 8, 2, 16, torch.float32, CPU))
    n = len(ids)
    pages = list(range(-(-(n + 1) // 8)))
    runner.run(step_inputs(ids, list(range(n)), list(range(n)), [0], [n], [n], [pages], [n - 1], [0], CPU, 8))
    nxt = 7
    d = DecodeInputs(torch.tensor([nxt]), torch.tensor([n]), torch.tensor([n]),
                     torch.tensor([pages], dtype=torch.int32), torch.tensor([n + 1], dtype=torch.int32))
    plain = runner.decode(d)
    buf = torch.full_like(plain, float("nan"))
    got = runner.decode(d, out=buf)
    assert got.data_ptr() == buf.data_ptr() and torch.equal(buf, plain)
    with torch.no_grad():
        ref = model(torch.tensor([ids + [nxt]])).logits[0, -1]
    torch.testing.assert_close(buf[0], ref, atol=1e-4, rtol=1e-4)

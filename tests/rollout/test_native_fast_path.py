"""The native engine's decode fast path: batched paged attention against per-sequence SDPA,
decode bursts against one-step decoding, sampled log-probs against the trainer's log-probs,
``ignore_eos``, cache reuse across calls, and the unsupported tensor-parallel setting.

The CUDA-only parts (Triton kernel, CUDA graphs) are in ``test_native_cuda.py``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from rlforge.errors import ConfigError
from rlforge.roles.forward import response_log_probs
from rlforge.rollout import SamplingParams
from rlforge.rollout.native import NativeRollout
from rlforge.rollout.native.attention import (
    batched_prefill_attention,
    build_prefill_batch,
    decode_attention_torch,
    prefill_attention,
)
from rlforge.rollout.native.sequence import SequenceStatus

CPU = torch.device("cpu")
TEXTS = ["What is 2 + 3?", "Compute the sum of seven and eleven, then subtract four from it please.", "Hi"]


def _native(model, tok, **kw) -> NativeRollout:
    return NativeRollout(model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, **kw)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (7, 1)])
def test_batched_decode_attention_equals_per_sequence_sdpa(heads, kv_heads):
    """Each row's output equals causal SDPA of its last token over its own gathered context,
    with scattered (non-contiguous, shuffled) blocks and different context lengths, GQA included."""
    g = torch.Generator().manual_seed(0)
    bs, d, nblocks = 4, 8, 40
    kc = torch.randn(nblocks, bs, kv_heads, d, generator=g)
    vc = torch.randn(nblocks, bs, kv_heads, d, generator=g)
    ctx = [1, 5, 16, 13]
    perm = torch.randperm(nblocks, generator=g).tolist()
    tables, used = [], 0
    for c in ctx:
        n = -(-c // bs)
        tables.append(perm[used:used + n])
        used += n
    width = max(len(t) for t in tables)
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    q = torch.randn(len(ctx), heads, d, generator=g)
    got = decode_attention_torch(q, kc, vc, bt, torch.tensor(ctx, dtype=torch.int32), d ** -0.5)
    for i, c in enumerate(ctx):
        # independent reference: contiguous K/V of the row, plain softmax attention per head
        k = kc[tables[i]].reshape(-1, kv_heads, d)[:c]
        v = vc[tables[i]].reshape(-1, kv_heads, d)[:c]
        for h in range(heads):
            kvh = h // (heads // kv_heads)
            w = torch.softmax(k[:, kvh] @ q[i, h] * d ** -0.5, dim=0)
            torch.testing.assert_close(got[i, h], w @ v[:, kvh], atol=1e-5, rtol=1e-5)
        # and the prefill path agrees for a one-token chunk
        pre = prefill_attention(q[i:i + 1], kc, vc, torch.tensor(tables[i]), c, d ** -0.5)
        torch.testing.assert_close(got[i:i + 1], pre, atol=1e-5, rtol=1e-5)


def test_batched_prefill_equals_per_sequence_prefill():
    """Chunks of different lengths, some after cached context (prefix hits, chunked prefill),
    attended in one padded call, equal one SDPA call per sequence."""
    g = torch.Generator().manual_seed(1)
    bs, heads, kvh, d = 4, 6, 2, 8
    kc = torch.randn(30, bs, kvh, d, generator=g)
    vc = torch.randn(30, bs, kvh, d, generator=g)
    perm = torch.randperm(30, generator=g).tolist()
    # (query_len, context_len): a whole prompt, a chunk after 8 cached tokens, a 2-token tail
    shapes = [(7, 7), (5, 13), (2, 10)]
    chunks, start, used = [], 0, 0
    for n, ctx in shapes:
        nb = -(-ctx // bs)
        chunks.append((start, n, ctx, perm[used:used + nb]))
        start, used = start + n, used + nb
    q = torch.randn(start + 3, heads, d, generator=g)  # 3 extra rows stand for decode rows
    rows, out = batched_prefill_attention(q, kc.view(-1, kvh, d), vc.view(-1, kvh, d),
                                          build_prefill_batch(chunks, bs, CPU), d ** -0.5)
    assert rows.tolist() == list(range(start))
    for s0, n, ctx, bt in chunks:
        want = prefill_attention(q[s0:s0 + n], kc, vc, torch.tensor(bt), ctx, d ** -0.5)
        torch.testing.assert_close(out[s0:s0 + n], want, atol=1e-5, rtol=1e-5)


def test_padding_row_gives_zeros():
    kc = torch.randn(3, 4, 2, 8)
    out = decode_attention_torch(torch.randn(2, 2, 8), kc, kc, torch.zeros(2, 1, dtype=torch.int32),
                                 torch.tensor([0, 3], dtype=torch.int32), 0.5)
    assert torch.equal(out[0], torch.zeros(2, 8)) and torch.isfinite(out).all()


def test_decode_bursts_equal_single_steps(model, tiny_tokenizer, batch):
    """Greedy and seeded sampling give the same tokens whether the host reads every step
    (burst 1) or every 7 steps; EOS inside a burst ends the response at the same place."""
    greedy = SamplingParams(do_sample=False, max_new_tokens=20)
    one = _native(model, tiny_tokenizer, max_decode_burst=1).generate(batch, greedy)
    seven = _native(model, tiny_tokenizer, max_decode_burst=7).generate(batch, greedy)
    assert torch.equal(one["responses"], seven["responses"])
    assert torch.equal(one["response_mask"], seven["response_mask"])
    # an EOS that one row emits early: the burst must cut the response there
    eos = one["responses"][0, 3].item()
    early1 = NativeRollout(model, [eos], tiny_tokenizer.pad_token_id, CPU, progress=False,
                           max_decode_burst=1).generate(batch, greedy)
    early7 = NativeRollout(model, [eos], tiny_tokenizer.pad_token_id, CPU, progress=False,
                           max_decode_burst=7).generate(batch, greedy)
    assert torch.equal(early1["responses"], early7["responses"])
    assert early7["response_mask"][0].sum() <= 4


def _overlap_pair(model, tok, batch, params, eos=None, expect="rollout/overlapped_bursts", metrics=None, **kw):
    """The same generation with overlapped steps off and on (burst 3, so many bursts follow each
    other); the overlapped run must have overlapped some steps of the ``expect`` kind."""
    eos_ids = [tok.eos_token_id] if eos is None else [eos]
    runs = []
    for overlap in (False, True):
        ro = NativeRollout(model, eos_ids, tok.pad_token_id, CPU, progress=False,
                           **{"max_decode_burst": 3, **kw}, overlap_steps=overlap)
        launch = ro._launch_burst

        def checked(runner, out, *a, launch=launch, **k):
            # a sequence the host knows has ended is never decoded again
            assert all(q.status is SequenceStatus.RUNNING and q.block_table for q in out.seqs)
            return launch(runner, out, *a, **k)

        ro._launch_burst = checked
        out = ro.generate(batch, params)
        m = ro.metrics()
        if metrics is not None:
            metrics.append(m)
        runs.append((out, m[expect], m["rollout/overlapped_bursts"] + m["rollout/overlapped_mixed_steps"]))
    (serial, _, n_serial), (overlapped, n_expect, _) = runs
    assert n_serial == 0 and n_expect > 0  # the second run did launch steps ahead of its reads
    return serial, overlapped


def test_overlapped_mixed_steps_equal_serial_steps(model, tiny_tokenizer, batch, monkeypatch):
    """Mixed steps (chunked prefill beside decodes, 8 tokens a step) launched before the step
    before them is read, their decode rows fed its tokens on the device, give the serial tokens:
    greedy; an EOS that a row samples as its very first token, in a mixed step (that row's
    response is that one token); one new token each (every row ends at a mixed step, the last
    one read after the loop); seeded sampling with log-probs; preemption in a cache of 12 blocks."""
    greedy = SamplingParams(do_sample=False, max_new_tokens=12)
    mixed = dict(max_num_batched_tokens=8, expect="rollout/overlapped_mixed_steps")
    a, b = _overlap_pair(model, tiny_tokenizer, batch, greedy, **mixed)
    assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["response_mask"], b["response_mask"])
    eos = a["responses"][0, 0].item()
    made = _record_sequences(monkeypatch)
    a2, b2 = _overlap_pair(model, tiny_tokenizer, batch, greedy, eos=eos, **mixed)
    assert torch.equal(a2["responses"], b2["responses"]) and torch.equal(a2["response_mask"], b2["response_mask"])
    assert made[3].output_ids == made[0].output_ids == [eos]  # ended at its first token, later ones dropped
    for i in (1, 2):  # the other rows: the greedy tokens up to their own first EOS, as without it
        row = a["responses"][i].tolist()
        want = row[: row.index(eos) + 1] if eos in row else row
        assert made[3 + i].output_ids == made[i].output_ids == want
    one = SamplingParams(do_sample=False, max_new_tokens=1)
    a, b = _overlap_pair(model, tiny_tokenizer, batch, one, **mixed)
    assert torch.equal(a["responses"], b["responses"]) and a["responses"].shape[1] == 1
    sampled = SamplingParams(temperature=1.0, max_new_tokens=9)
    a, b = _overlap_pair(model, tiny_tokenizer, batch, sampled, ignore_eos=True, seed=5, calculate_log_probs=True,
                         **mixed)
    assert torch.equal(a["responses"], b["responses"])
    torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], atol=0, rtol=0)
    ms: list = []
    a, b = _overlap_pair(model, tiny_tokenizer, batch, greedy, block_size=4, num_blocks=12, metrics=ms, **mixed)
    assert torch.equal(a["responses"], b["responses"])
    assert ms[1]["rollout/num_preemptions"] > 0


def _record_sequences(monkeypatch) -> list:
    """Every Sequence the engine makes from now on, in order."""
    import rlforge.rollout.native.engine as engine_module

    orig, made = engine_module.Sequence, []

    def make(*a):
        made.append(orig(*a))
        return made[-1]

    monkeypatch.setattr(engine_module, "Sequence", make)
    return made


def test_overlapped_bursts_equal_serial_bursts(model, tiny_tokenizer, batch, monkeypatch):
    """Launching a burst before reading the one before it changes no token: greedy, greedy with an
    EOS that one row samples early (its response ends at that EOS, as a plain step-by-step run
    says), seeded sampling without EOS (the same rows in every step, so the same random draws), and
    more rows than ``max_num_seqs`` (a waiting row is admitted when the first ones end)."""
    greedy = SamplingParams(do_sample=False, max_new_tokens=20)
    serial, over = _overlap_pair(model, tiny_tokenizer, batch, greedy)
    assert torch.equal(serial["responses"], over["responses"])
    assert torch.equal(serial["response_mask"], over["response_mask"])
    eos = serial["responses"][0, 4].item()
    first = serial["responses"][0].tolist().index(eos)  # the row's first EOS (the token may recur)
    step = NativeRollout(model, [eos], tiny_tokenizer.pad_token_id, CPU, progress=False,
                         max_decode_burst=1, overlap_steps=False).generate(batch, greedy)
    made = _record_sequences(monkeypatch)
    cut_serial, cut_over = _overlap_pair(model, tiny_tokenizer, batch, greedy, eos=eos)
    assert torch.equal(cut_over["responses"], step["responses"])
    assert torch.equal(cut_over["response_mask"], step["response_mask"])
    assert torch.equal(cut_serial["responses"], step["responses"])
    assert cut_over["response_mask"][0].sum() == first + 1
    # the Sequences themselves end at the EOS: the overlapped burst's tokens after it were dropped
    assert made[3].output_ids == made[0].output_ids == serial["responses"][0, : first + 1].tolist()
    assert [len(q.output_ids) for q in made[3:]] == [len(q.output_ids) for q in made[:3]]
    sampled = SamplingParams(temperature=1.0, max_new_tokens=17)
    a, b = _overlap_pair(model, tiny_tokenizer, batch, sampled, ignore_eos=True, seed=3, calculate_log_probs=True)
    assert torch.equal(a["responses"], b["responses"])
    torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], atol=0, rtol=0)
    a, b = _overlap_pair(model, tiny_tokenizer, batch, greedy, ignore_eos=True, max_num_seqs=2)
    assert torch.equal(a["responses"], b["responses"])


def test_overlapped_bursts_stop_each_row_at_its_own_length(model, tiny_tokenizer, batch, monkeypatch):
    """Rows with different ``max_new_tokens`` (as the long-tail benchmark gives them): each row gets
    exactly its length, and its tokens are the first tokens of the longest greedy run (greedy tokens
    do not depend on when a row stops), with overlapped bursts on."""
    import rlforge.rollout.native.engine as engine_module

    lengths = [5, 11, 20]
    orig, made = engine_module.Sequence, []

    def make(i, ids, n):
        made.append(orig(i, ids, lengths[i]))
        return made[-1]

    monkeypatch.setattr(engine_module, "Sequence", make)
    greedy = SamplingParams(do_sample=False, max_new_tokens=20)
    _overlap_pair(model, tiny_tokenizer, batch, greedy, ignore_eos=True)
    monkeypatch.setattr(engine_module, "Sequence", orig)
    full = NativeRollout(model, [], tiny_tokenizer.pad_token_id, CPU, progress=False, ignore_eos=True,
                         overlap_steps=False).generate(batch, greedy)
    serial, over = made[:3], made[3:]  # the Sequences of the serial run, then of the overlapped one
    assert [len(s.output_ids) for s in over] == [len(s.output_ids) for s in serial] == lengths
    for s, t in zip(over, serial, strict=True):
        assert s.output_ids == t.output_ids == full["responses"][s.seq_id, : lengths[s.seq_id]].tolist()


def test_rollout_log_probs_equal_trainer_log_probs(model, tiny_tokenizer, batch):
    """``calculate_log_probs``: the engine's log-probs of its sampled tokens equal the trainer's
    ``response_log_probs`` (a plain transformers forward) at the same temperature."""
    params = SamplingParams(temperature=0.7, max_new_tokens=10)
    out = _native(model, tiny_tokenizer, calculate_log_probs=True, seed=0).generate(batch, params)
    with torch.no_grad():
        ref, _ = response_log_probs(model, out, 0.7, with_entropy=False)
    mask = out["response_mask"].bool()
    assert out["rollout_log_probs"].shape == out["responses"].shape
    torch.testing.assert_close(out["rollout_log_probs"][mask], ref[mask], atol=1e-4, rtol=1e-4)
    assert (out["rollout_log_probs"][~mask] == 0).all()


def test_ignore_eos_generates_full_length(model, tiny_tokenizer, batch):
    greedy = SamplingParams(do_sample=False, max_new_tokens=9)
    normal = _native(model, tiny_tokenizer).generate(batch, greedy)
    eos = normal["responses"][0, 2].item()
    cut = NativeRollout(model, [eos], tiny_tokenizer.pad_token_id, CPU, progress=False).generate(batch, greedy)
    full = NativeRollout(model, [eos], tiny_tokenizer.pad_token_id, CPU, progress=False,
                         ignore_eos=True).generate(batch, greedy)
    assert cut["response_mask"][0].sum() == 3
    assert full["response_mask"].sum() == full["responses"].numel() == 3 * 9
    assert torch.equal(full["responses"], normal["responses"])  # same tokens, nothing cut


def test_kept_cache_is_reused_and_freed_cache_is_not(model, tiny_tokenizer, batch):
    greedy = SamplingParams(do_sample=False, max_new_tokens=6)
    keep = _native(model, tiny_tokenizer, free_cache_engine=False)
    a = keep.generate(batch, greedy)
    cache = keep._cache
    b = keep.generate(batch, greedy)
    assert cache is not None and keep._cache is cache
    assert torch.equal(a["responses"], b["responses"])
    free = _native(model, tiny_tokenizer, free_cache_engine=True)
    c = free.generate(batch, greedy)
    assert free._cache is None and torch.equal(a["responses"], c["responses"])
    m = free.metrics()
    assert m["rollout/wake_s"] >= 0 and m["rollout/sleep_s"] >= 0 and m["rollout/gen_s"] > 0


def test_tensor_parallel_rollout_on_one_process_is_a_clear_error(model, tiny_tokenizer):
    cfg = SimpleNamespace(tensor_model_parallel_size=2)  # TP itself: test_native_tp.py (2 ranks)
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=2 does not divide the 1 process"):
        NativeRollout.from_config(model, [0], 0, CPU, None, cfg)


def test_verl_backend_names_run_as_native_where_it_applies(model, tiny_tokenizer, batch):
    """``vllm``/``sglang`` map to ``native`` for a Llama/Qwen model (verl's default
    ``tensor_model_parallel_size=2`` runs with one model copy per GPU), else to ``hf``; ``native``
    on a model it cannot run is a clear error, not a crash mid-rollout."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlforge.config import load_config
    from rlforge.trainer.builders.rollout import rollout_name

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50))
    for name, tp, module, want in [("vllm", 1, model, "native"), ("sglang", 1, model, "native"),
                                   ("vllm", 2, model, "native"), ("vllm", 1, gpt2, "hf"), ("hf", 1, model, "hf")]:
        cfg = load_config([f"actor_rollout_ref.rollout.name={name}",
                           f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}"])
        assert rollout_name(cfg, module) == want, (name, tp, want)
    verl_default = load_config(["actor_rollout_ref.rollout.name=vllm"]).actor_rollout_ref.rollout
    assert verl_default.tensor_model_parallel_size == 2
    eng = NativeRollout.from_config(model, [tiny_tokenizer.eos_token_id], tiny_tokenizer.pad_token_id, CPU, None,
                                    verl_default)
    out = eng.generate(batch, SamplingParams(do_sample=False, max_new_tokens=4))
    assert out["responses"].shape == (len(batch), 4)
    with pytest.raises(ConfigError, match="model_type 'gpt2'.*rollout.name=hf"):
        NativeRollout.from_config(gpt2, [0], 0, CPU, None, SimpleNamespace(tensor_model_parallel_size=1))


@pytest.mark.e2e
def test_calculate_log_probs_reaches_the_metrics(tmp_path):
    """With ``calculate_log_probs`` the trainer logs verl's ``training/rollout_probs_diff_*``:
    near 0 here, since the native engine and the trainer compute the same float32 model."""
    import json

    from rlforge.cli import main

    assert main([
        "train", "actor_rollout_ref.model.path=preset:tiny", "actor_rollout_ref.rollout.name=native",
        "actor_rollout_ref.rollout.calculate_log_probs=true", "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "data.max_response_length=6",
        "data.builtin.train_size=4", "trainer.total_training_steps=1", "trainer.val_before_train=false",
        "trainer.logger=[file]", f"trainer.default_local_dir={tmp_path}",
    ]) == 0
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[-1])
    assert 0 <= row["training/rollout_probs_diff_max"] < 1e-4
    assert row["training/rollout_probs_diff_mean"] <= row["training/rollout_probs_diff_max"]


@pytest.mark.e2e
def test_longer_than_the_model_context_is_a_clear_error(tmp_path, capsys):
    from rlforge.cli import main

    rc = main(["train", "actor_rollout_ref.model.path=preset:tiny", "data.max_response_length=4000",
               "trainer.total_training_steps=1", f"trainer.default_local_dir={tmp_path}"])
    assert rc == 2
    assert "max_position_embeddings=2048" in capsys.readouterr().err

"""The ``rlforge_varlen`` attention implementation (:mod:`rlforge.engine.varlen`).

CPU: packed log-probs, entropies, critic values and gradients through the varlen path equal
the padded ``sdpa`` forward's (GQA tiny model, sequences of different lengths, plain and
chunked head); the padded forward with the implementation set is sdpa's; the sequence
boundaries come from ``cu_seqlens`` (wrong offsets change the output); the sliding window.
CUDA only: ``varlen_attn`` in bf16 against the per-sequence SDPA loop, forward and backward,
and a packed model forward under autocast.
"""

from __future__ import annotations

import copy
from unittest import mock

import pytest
import torch
from helpers import left_padded_batch

from rlforge.batch import Batch
from rlforge.engine import varlen
from rlforge.engine.packing import pack, packed_response_log_probs, packed_response_values
from rlforge.errors import ModelError
from rlforge.roles.forward import response_log_probs, response_values

EOS = 2
R = 9
OVERRIDE = {"initializer_range": 0.2}


def _batch(pad: int, p_lens: list[int], eos_at: list[int | None], seed: int = 0) -> Batch:
    """Left-padded prompts of ``p_lens`` tokens and responses ending at ``eos_at``."""
    return left_padded_batch(pad, EOS, p_lens, eos_at, R, seed)


@pytest.fixture(scope="module")
def batch(tiny_tokenizer):
    b = _batch(tiny_tokenizer.pad_token_id, [3, 11, 1, 6, 2, 8], [0, 8, 6, None, 2, 4])
    lens = b["attention_mask"].sum(1).tolist()
    assert len(set(lens)) == len(lens), lens  # all sequence lengths differ
    return b


@pytest.fixture(scope="module")
def sdpa_model(tiny_tokenizer):
    from rlforge.models import load_causal_lm

    return load_causal_lm("preset:tiny", tiny_tokenizer, OVERRIDE, seed=1).eval()


@pytest.fixture(scope="module")
def varlen_model(tiny_tokenizer):
    from rlforge.models import load_causal_lm

    m = load_causal_lm("preset:tiny", tiny_tokenizer, {**OVERRIDE, "attn_implementation": "rlforge_varlen"},
                       seed=1).eval()
    assert m.config._attn_implementation == "rlforge_varlen"
    assert m.config.num_key_value_heads < m.config.num_attention_heads  # GQA
    return m


def _count_varlen_calls():
    """Patch the CPU varlen path with a counting wrapper (same results)."""
    return mock.patch.object(varlen, "sdpa_varlen_reference", wraps=varlen.sdpa_varlen_reference)


@pytest.mark.parametrize("chunk_size", [0, 4])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_varlen_log_probs_equal_padded_sdpa(sdpa_model, varlen_model, batch, chunk_size, temperature):
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        ref_lp, ref_ent = response_log_probs(sdpa_model, batch, temperature, with_entropy=True)
        with _count_varlen_calls() as spy:
            lp, ent = packed_response_log_probs(varlen_model, batch, temperature, with_entropy=True,
                                                chunk_size=chunk_size)
    assert spy.call_count == varlen_model.config.num_hidden_layers  # the varlen path ran, once per layer
    assert ent is not None
    torch.testing.assert_close(lp[mask], ref_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[mask], ref_ent[mask], atol=1e-5, rtol=0)
    assert (lp[~mask] == 0).all()
    assert ref_lp[mask].std() > 0.1  # informative log-probs


def test_no_dense_mask_is_built(varlen_model, batch):
    """transformers returns the placeholder 4D mask as is: no (N, N) mask function runs."""
    from transformers.masking_utils import AttentionMaskInterface

    fail = mock.Mock(side_effect=AssertionError("a mask was built"))
    with torch.no_grad(), mock.patch.dict(AttentionMaskInterface._global_mapping, {"rlforge_varlen": fail}):
        packed_response_log_probs(varlen_model, batch, 1.0, with_entropy=False)


def test_packed_varlen_gradients_equal_padded_sdpa(sdpa_model, varlen_model, batch):
    mask = batch["response_mask"].bool()
    grads = []
    for model, fn in ((sdpa_model, response_log_probs), (varlen_model, packed_response_log_probs)):
        m = copy.deepcopy(model).train()
        lp, ent = fn(m, batch, 0.8, with_entropy=True)
        loss = -(lp * torch.linspace(-1.0, 2.0, lp.shape[1]))[mask].sum() - 0.1 * ent[mask].sum()
        loss.backward()
        grads.append({n: p.grad for n, p in m.named_parameters()})
    ref, got = grads
    assert ref.keys() == got.keys()
    for n in ref:
        assert got[n] is not None, n
        torch.testing.assert_close(got[n], ref[n], atol=1e-5, rtol=1e-4, msg=n)
    assert max(float(g.abs().max()) for n, g in ref.items() if "self_attn.k_proj" in n) > 1e-4


def test_padded_forward_delegates_to_sdpa(sdpa_model, varlen_model, batch):
    """Without cu_seqlens (padded forwards, generate) the implementation is transformers' sdpa."""
    with torch.no_grad(), _count_varlen_calls() as spy:
        kw = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
              "position_ids": batch["position_ids"], "use_cache": False}
        got = varlen_model(**kw).logits
        ref = sdpa_model(**kw).logits
        one = batch["input_ids"][1:2, -5:]
        got_causal = varlen_model(input_ids=one, use_cache=False).logits
        ref_causal = sdpa_model(input_ids=one, use_cache=False).logits
    assert spy.call_count == 0
    torch.testing.assert_close(got, ref, atol=0, rtol=0)
    torch.testing.assert_close(got_causal, ref_causal, atol=0, rtol=0)


def test_generate_works_with_varlen_set(tiny_tokenizer, varlen_model, sdpa_model):
    ids = torch.randint(100, 1000, (2, 5), generator=torch.Generator().manual_seed(3))
    kw = {"max_new_tokens": 4, "do_sample": False, "pad_token_id": tiny_tokenizer.pad_token_id}
    with torch.no_grad():
        assert torch.equal(varlen_model.generate(ids, **kw), sdpa_model.generate(ids, **kw))


def test_packed_values_equal_padded_with_varlen(tiny_tokenizer, batch):
    from rlforge.models import load_value_model

    ref_critic = load_value_model("preset:tiny", tiny_tokenizer, OVERRIDE, seed=2).eval()
    critic = load_value_model("preset:tiny", tiny_tokenizer, {**OVERRIDE, "attn_implementation": "rlforge_varlen"},
                              seed=2).eval()
    assert critic.config._attn_implementation == "rlforge_varlen"
    mask = batch["response_mask"].bool()
    with torch.no_grad(), _count_varlen_calls() as spy:
        got = packed_response_values(critic, batch)
        ref = response_values(ref_critic, batch)
    assert spy.call_count == critic.config.num_hidden_layers
    torch.testing.assert_close(got[mask], ref[mask], atol=1e-5, rtol=0)


def test_wrong_boundaries_change_the_output(varlen_model, batch):
    """Negative control: the sequence boundaries come from cu_seqlens (the mask is a placeholder)."""
    p = pack(batch)
    mask, kw = varlen.packed_attention_args(varlen_model, p.cu_seqlens)
    assert mask is not None and mask.shape == (1, 1, 1, 1)
    n = p.input_ids.shape[1]
    wrong = {**kw, "cu_seq_lens_q": torch.tensor([0, n], dtype=torch.int32),
             "cu_seq_lens_k": torch.tensor([0, n], dtype=torch.int32), "max_length_q": n, "max_length_k": n}
    with torch.no_grad():
        good = varlen_model(input_ids=p.input_ids, position_ids=p.position_ids, attention_mask=mask, use_cache=False,
                            **kw).logits
        bad = varlen_model(input_ids=p.input_ids, position_ids=p.position_ids, attention_mask=mask, use_cache=False,
                           **wrong).logits
    first = int(p.cu_seqlens[1])
    torch.testing.assert_close(good[:, :first], bad[:, :first], atol=1e-5, rtol=0)  # the first sequence is alone
    assert (good[:, first:] - bad[:, first:]).abs().max() > 1e-2


def test_sliding_window_matches_explicit_mask():
    g = torch.Generator().manual_seed(0)
    lens, hq, hkv, d, window = [7, 2, 5], 4, 2, 8, 3
    n = sum(lens)
    q, k, v = (torch.randn(1, h, n, d, generator=g) for h in (hq, hkv, hkv))
    cu = torch.tensor([0, 7, 9, 14], dtype=torch.int32)
    module = torch.nn.Module()
    out, _ = varlen.varlen_attention_forward(module, q, k, v, None, scaling=0.3, sliding_window=window,
                                             cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=7, max_length_k=7)
    assert out.shape == (1, n, hq, d)
    seq = torch.repeat_interleave(torch.arange(3), torch.tensor(lens))
    pos = torch.arange(n) - torch.repeat_interleave(cu[:-1].long(), torch.tensor(lens))
    allowed = (seq[:, None] == seq[None]) & (pos[None] <= pos[:, None]) & (pos[None] > pos[:, None] - window)
    kr, vr = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
    scores = (q @ kr.transpose(-1, -2) * 0.3).masked_fill(~allowed, float("-inf"))
    ref = (scores.softmax(-1) @ vr).transpose(1, 2)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def _fake_varlen_2_11(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                      window_size=(-1, -1), enable_gqa=False):
    """torch >= 2.11's varlen_attn signature, computed by the reference."""
    assert window_size[1] == 0 and (enable_gqa or query.shape[1] == key.shape[1])
    window = None if window_size[0] < 0 else window_size[0] + 1
    return varlen.sdpa_varlen_reference(query, key, value, cu_seq_q, cu_seq_k, scale, window)


def _fake_varlen_old(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, is_causal=False,
                     scale=None):
    """The older signature: ``is_causal``, no GQA."""
    assert is_causal and query.shape[1] == key.shape[1]
    return varlen.sdpa_varlen_reference(query, key, value, cu_seq_q, cu_seq_k, scale)


@pytest.mark.parametrize("fake", [_fake_varlen_2_11, _fake_varlen_old])
@pytest.mark.parametrize("window", [None, 4])
def test_call_varlen_attn_adapts_to_the_signature(fake, window):
    """The arguments built for either varlen_attn signature (causal flag or window, GQA or
    repeated K/V heads) give the per-sequence reference's result."""
    import inspect

    g = torch.Generator().manual_seed(1)
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    q, k, v = (torch.randn(13, h, 8, generator=g) for h in (6, 2, 2))
    ref = varlen.sdpa_varlen_reference(q, k, v, cu, cu, 0.4, window)
    params = frozenset(inspect.signature(fake).parameters)
    if window is not None and "window_size" not in params:
        with pytest.raises(ValueError, match="window_size"):
            varlen.call_varlen_attn(fake, params, q, k, v, cu, cu, 7, 7, 0.4, window)
        return
    torch.testing.assert_close(varlen.call_varlen_attn(fake, params, q, k, v, cu, cu, 7, 7, 0.4, window), ref)


def test_installed_varlen_attn_signature_is_understood():
    fn, params = varlen._varlen_attn()
    if fn is None:
        pytest.skip("this torch has no torch.nn.attention.varlen.varlen_attn")
    assert "scale" in params and ("window_size" in params or "is_causal" in params), sorted(params)


def test_selection(tiny_tokenizer, monkeypatch):
    from rlforge.models import load_causal_lm

    m = load_causal_lm("preset:tiny", tiny_tokenizer, seed=0)
    cpu = torch.device("cpu")
    assert not varlen.maybe_select_varlen(m, cpu, True, {})  # no CUDA kernel: today's behaviour
    monkeypatch.setattr(varlen, "varlen_available", lambda device: True)
    assert not varlen.maybe_select_varlen(m, cpu, False, {})  # not packed
    assert not varlen.maybe_select_varlen(m, cpu, True, {"attn_implementation": "sdpa"})  # the user's choice
    assert m.config._attn_implementation == "sdpa"
    assert varlen.maybe_select_varlen(m, cpu, True, {})
    assert m.config._attn_implementation == "rlforge_varlen"


def test_unsupported_architecture_is_refused(tiny_tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlforge.models.loader import _set_attn_implementation

    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64))
    assert varlen.unsupported_reason(gpt2) is not None
    with pytest.raises(ModelError, match="override_config.attn_implementation=rlforge_varlen"):
        _set_attn_implementation(gpt2, "rlforge_varlen", "actor_rollout_ref.model.path")


# ----------------------------------------------------------------------------- CUDA only
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cuda_inputs(lens: list[int], hq: int, hkv: int, d: int, dtype: torch.dtype):
    g = torch.Generator(device="cuda").manual_seed(0)
    n = sum(lens)
    q, k, v = (torch.randn(1, h, n, d, generator=g, device="cuda") for h in (hq, hkv, hkv))
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device="cuda")
    cu[1:] = torch.cumsum(torch.tensor(lens, device="cuda"), 0)
    return [t.to(dtype).requires_grad_() for t in (q, k, v)], cu, max(lens)


def _run(q, k, v, cu, max_len, window, kernel: bool):
    """Output (1, N, Hq, D) and (dq, dk, dv) for a fixed upstream gradient; ``kernel`` picks
    varlen_attn (through the attention function) or the per-sequence SDPA loop."""
    if kernel:
        out, _ = varlen.varlen_attention_forward(torch.nn.Module(), q, k, v, None, scaling=0.125,
                                                 sliding_window=window, cu_seq_lens_q=cu, cu_seq_lens_k=cu,
                                                 max_length_q=max_len, max_length_k=max_len)
    else:
        qs, ks, vs = (t[0].transpose(0, 1) for t in (q, k, v))
        out = varlen.sdpa_varlen_reference(qs, ks, vs, cu, cu, 0.125, window).unsqueeze(0)
    grad = torch.cos(torch.arange(out.numel(), device="cuda", dtype=torch.float32)).view_as(out).to(out.dtype)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
    return out.float(), dq.float(), dk.float(), dv.float()


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("hq,hkv,d,window", [(8, 8, 64, None), (14, 2, 64, None), (16, 4, 128, None),
                                             (8, 2, 64, 32)])
def test_cuda_varlen_attn_matches_sdpa_loop_bf16(hq, hkv, d, window):
    """bf16 varlen_attn and the bf16 SDPA loop each against the float32 loop: the kernel's
    error is at most twice the loop's plus a small floor (forward and backward)."""
    if not varlen.varlen_available(torch.device("cuda")):
        pytest.skip("torch.nn.attention.varlen.varlen_attn is not available on this GPU/torch")
    lens = [1, 17, 130, 64, 257, 3]
    (q, k, v), cu, max_len = _cuda_inputs(lens, hq, hkv, d, torch.bfloat16)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    with mock.patch.object(varlen, "sdpa_varlen_reference", side_effect=AssertionError("fell back to the loop")):
        got = _run(q, k, v, cu, max_len, window, kernel=True)
    loop = _run(q, k, v, cu, max_len, window, kernel=False)
    ref = _run(q32, k32, v32, cu, max_len, window, kernel=False)
    for name, g, lo, r in zip(("out", "dq", "dk", "dv"), got, loop, ref, strict=True):
        assert torch.isfinite(g).all(), name
        err, loop_err = float((g - r).abs().max()), float((lo - r).abs().max())
        assert err <= 2 * loop_err + 2e-3, f"{name}: varlen_attn error {err:.3g} vs SDPA loop error {loop_err:.3g}"


@cuda
@pytest.mark.cuda
def test_cuda_packed_model_under_autocast(tiny_tokenizer, batch):
    """The packed forward on the GPU under bf16 autocast (q/k float32 after RoPE, v bf16) runs
    varlen_attn and is as close to the float32 padded forward as the bf16 padded sdpa forward."""
    from rlforge.models import load_causal_lm

    if not varlen.varlen_available(torch.device("cuda")):
        pytest.skip("torch.nn.attention.varlen.varlen_attn is not available on this GPU/torch")
    b = batch.to("cuda")
    sdpa = load_causal_lm("preset:tiny", tiny_tokenizer, OVERRIDE, seed=1).eval().cuda()
    var = load_causal_lm("preset:tiny", tiny_tokenizer, {**OVERRIDE, "attn_implementation": "rlforge_varlen"},
                         seed=1).eval().cuda()
    mask = b["response_mask"].bool()
    with torch.no_grad():
        ref32, _ = response_log_probs(sdpa, b, 1.0, with_entropy=False)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            lp_sdpa, _ = response_log_probs(sdpa, b, 1.0, with_entropy=False)
            with mock.patch.object(varlen, "sdpa_varlen_reference", side_effect=AssertionError("fell back")):
                lp_var, _ = packed_response_log_probs(var, b, 1.0, with_entropy=False)
    err = float((lp_var - ref32)[mask].abs().max())
    sdpa_err = float((lp_sdpa - ref32)[mask].abs().max())
    assert err <= 2 * sdpa_err + 1e-3, (err, sdpa_err)

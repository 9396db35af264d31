"""The native runner's GEMM weights (rlforge/rollout/native/rollout_weights.py): packed Q/K/V and
gate/up give the unpacked engine's tokens; float32 master weights under bfloat16 autocast are
cast once per generation and still give the trainer's log-probs; in-place updates and new
weight tensors reach the next generation; the memory plan matches what is allocated."""

from __future__ import annotations

import pytest
import torch

from rlforge.roles.forward import response_log_probs
from rlforge.rollout import SamplingParams
from rlforge.rollout.native import NativeRollout
from rlforge.rollout.native.rollout_weights import RolloutWeights

CPU = torch.device("cpu")
TEXTS = ["What is 2 + 3?", "Compute the sum of seven and eleven, then subtract four from it please.", "Hi"]
GREEDY = SamplingParams(do_sample=False, max_new_tokens=12)


def _native(model, tok, **kw) -> NativeRollout:
    return NativeRollout(model, [tok.eos_token_id], tok.pad_token_id, CPU, progress=False, **kw)


def test_packed_projections_give_the_unpacked_tokens_and_log_probs(model, tiny_tokenizer, batch):
    params = SamplingParams(temperature=0.8, max_new_tokens=12)
    plain = _native(model, tiny_tokenizer, pack_weights=False, calculate_log_probs=True, seed=3)
    packed = _native(model, tiny_tokenizer, pack_weights=True, calculate_log_probs=True, seed=3)
    for p in (GREEDY, params):
        a, b = plain.generate(batch, p), packed.generate(batch, p)
        assert torch.equal(a["responses"], b["responses"])
        torch.testing.assert_close(a["rollout_log_probs"], b["rollout_log_probs"], atol=1e-5, rtol=1e-5)


def test_bf16_copies_of_fp32_weights_are_autocasts_operands(model, tiny_tokenizer, batch):
    """Float32 module under bfloat16 autocast (the trainer's setup on GPU): the runner reads bf16
    copies, made once per generation, equal to the casts autocast makes (Q/K/V and their biases
    packed in order), and its log-probs stay within bf16 error of the trainer's autocast forward."""
    params = SamplingParams(temperature=1.0, max_new_tokens=10)
    eng = _native(model, tiny_tokenizer, autocast_dtype=torch.bfloat16, pack_weights=True, calculate_log_probs=True,
                  seed=0, free_cache_engine=False)
    out = eng.generate(batch, params)
    w = eng._runner.weights
    assert w.copy_bytes() == RolloutWeights.planned_bytes(model, torch.bfloat16, True) > 0
    for lw, layer in zip(w.layers, model.model.layers, strict=True):
        att, mlp = layer.self_attn, layer.mlp
        want = torch.cat([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]).to(torch.bfloat16)
        assert torch.equal(lw.qkv[0].weight, want)
        if att.q_proj.bias is not None:
            assert torch.equal(lw.qkv[0].bias, torch.cat([att.q_proj.bias, att.k_proj.bias, att.v_proj.bias]).bfloat16())
        assert torch.equal(lw.gate_up[0].weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).bfloat16())
        assert torch.equal(lw.down.weight, mlp.down_proj.weight.bfloat16())
        assert torch.equal(lw.o.weight, att.o_proj.weight.bfloat16())
    assert torch.equal(w.lm_head.weight, model.lm_head.weight.bfloat16())
    mask = out["response_mask"].bool()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref, _ = response_log_probs(model, out, 1.0, with_entropy=False)
    torch.testing.assert_close(out["rollout_log_probs"][mask], ref.float()[mask], atol=0.1, rtol=0)


@pytest.mark.parametrize("pack", [True, False])
def test_kept_engine_sees_in_place_updates_and_new_tensors(model, tiny_tokenizer, batch, pack):
    """With the cache kept between calls: an in-place update (the optimizer's step) and a weight
    replaced by a new tensor both reach the next generation (same tokens as a fresh engine)."""
    kept = _native(model, tiny_tokenizer, pack_weights=pack, free_cache_engine=False)
    before = kept.generate(batch, GREEDY)
    k = model.model.layers[0].self_attn.k_proj
    up = model.model.layers[1].mlp.up_proj
    saved_k, saved_up = k.weight.detach().clone(), up.weight
    try:
        with torch.no_grad():
            k.weight.mul_(-3.0)
        inplace = kept.generate(batch, GREEDY)
        up.weight = torch.nn.Parameter(saved_up.detach() * 4.0)
        replaced = kept.generate(batch, GREEDY)
        fresh = _native(model, tiny_tokenizer, pack_weights=pack).generate(batch, GREEDY)
    finally:
        with torch.no_grad():
            k.weight.copy_(saved_k)
        up.weight = saved_up
    assert not torch.equal(before["responses"], inplace["responses"])
    assert not torch.equal(inplace["responses"], replaced["responses"])
    assert torch.equal(replaced["responses"], fresh["responses"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pack", [True, False])
def test_planned_bytes_match_the_copies(model, dtype, pack):
    w = RolloutWeights(model, dtype, pack)
    assert w.copy_bytes() == RolloutWeights.planned_bytes(model, dtype, pack)
    if dtype == torch.float32 and not pack:
        assert w.copy_bytes() == 0  # nothing to pack or cast: the module's own tensors
        assert w.layers[0].o.weight is model.model.layers[0].self_attn.o_proj.weight
    lw, att = w.layers[1], model.model.layers[1].self_attn
    q = lw.qkv[0].weight[: att.q_proj.weight.shape[0]]
    assert torch.equal(q, att.q_proj.weight.to(dtype))

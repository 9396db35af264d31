"""The shards of a tensor-parallel native rollout (:mod:`rlforge.rollout.native.tensor_parallel`),
checked by hand on ``preset:tiny`` (hidden 64, 4 heads and 2 KV heads of 16, MLP 128), and its
one-line errors.  The numerics on 2 ranks are in ``test_native_tp.py`` (e2e)."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from rlforge.errors import ConfigError
from rlforge.rollout.native import NativeRollout
from rlforge.rollout.native.tensor_parallel import (
    KEY,
    Slice,
    check_tp_size,
    copy_sliced,
    new_tp_group,
    shard_module_,
    shard_rules,
)


def test_rules_rank1_of_2(model):
    rules = shard_rules(model, model, 1, 2)
    p = "model.layers.0."
    assert rules[p + "self_attn.q_proj.weight"] == Slice(0, 32, 64)  # heads 2-3: rows 2*16 .. 4*16
    assert rules[p + "self_attn.k_proj.weight"] == Slice(0, 16, 32)  # KV head 1: rows 16 .. 32
    assert rules[p + "self_attn.v_proj.weight"] == Slice(0, 16, 32)
    assert rules[p + "self_attn.o_proj.weight"] == Slice(1, 32, 64)  # the columns of heads 2-3
    assert rules[p + "mlp.gate_proj.weight"] == Slice(0, 64, 128)
    assert rules[p + "mlp.up_proj.weight"] == Slice(0, 64, 128)
    assert rules[p + "mlp.down_proj.weight"] == Slice(1, 64, 128)
    assert len(rules) == 7 * 2  # 2 layers, no bias; embedding, norms and the (tied) LM head replicated
    assert not any("embed" in k or "norm" in k or "lm_head" in k for k in rules)


def test_shard_module_keeps_the_slices_in_place(model):
    m = copy.deepcopy(model)
    q = m.model.layers[1].self_attn.q_proj.weight
    full_q, full_down = q.detach().clone(), m.model.layers[1].mlp.down_proj.weight.detach().clone()
    shard_module_(m, shard_rules(m, m, 1, 2))
    assert m.model.layers[1].self_attn.q_proj.weight is q  # the same Parameter, new data
    assert q.shape == (32, 64) and torch.equal(q, full_q[32:64])
    down = m.model.layers[1].mlp.down_proj.weight
    assert down.shape == (64, 64) and torch.equal(down, full_down[:, 64:128])
    assert m.model.layers[1].self_attn.k_proj.weight.shape == (16, 64)
    assert m.lm_head.weight.shape == (49152, 64) and m.lm_head.weight is m.model.embed_tokens.weight


def test_biases_column_split_and_row_bias_on_rank0_only():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, attention_bias=True, mlp_bias=True)
    m = LlamaForCausalLM(cfg)
    p = "model.layers.0."
    for rank in (0, 1):
        rules = shard_rules(m, m, rank, 2)
        assert rules[p + "self_attn.q_proj.bias"] == Slice(0, 8 * rank, 8 * rank + 8)  # 2 heads x 4
        assert rules[p + "self_attn.k_proj.bias"] == Slice(0, 4 * rank, 4 * rank + 4)  # 1 KV head x 4
        assert rules[p + "mlp.up_proj.bias"] == Slice(0, 16 * rank, 16 * rank + 16)
        full = m.get_parameter(p + "self_attn.o_proj.bias").detach()
        o_bias = rules[p + "self_attn.o_proj.bias"].of(full)  # summed once by the all-reduce
        assert torch.equal(o_bias, full if rank == 0 else torch.zeros(16))
        assert torch.equal(rules[p + "mlp.down_proj.bias"].of(full), full if rank == 0 else torch.zeros(16))


def test_copy_sliced_copies_each_rank_its_slice(model):
    m = copy.deepcopy(model)
    rules = shard_rules(m, m, 0, 2)
    shard_module_(m, rules)
    name = "model.layers.0.mlp.gate_proj.weight"
    new = torch.arange(128 * 64, dtype=torch.float32).reshape(128, 64)
    copy_sliced([(name, new), ("not.in.module", new)], m, rules)
    assert torch.equal(m.get_parameter(name), new[:64])


@pytest.mark.parametrize("tp,heads,kv,world,names", [
    (3, 4, 2, 2, "2 process"), (4, 4, 2, 4, "2 key/value heads"), (2, 6, 3, 2, "3 key/value heads"),
])
def test_bad_tp_size_is_one_config_error(tp, heads, kv, world, names):
    with pytest.raises(ConfigError) as e:
        check_tp_size(tp, heads, kv, world)
    msg = str(e.value)
    assert msg.startswith(f"{KEY}={tp}") and names in msg and "\n" not in msg


def test_from_config_tp2_in_one_process_names_the_key(model, tiny_tokenizer):
    cfg = SimpleNamespace(name="native", tensor_model_parallel_size=2, max_num_seqs=8, max_num_batched_tokens=64,
                          enable_prefix_caching=True, gpu_memory_utilization=0.5, enforce_eager=False,
                          cudagraph_capture_sizes=None, free_cache_engine=True, calculate_log_probs=False,
                          ignore_eos=False)
    with pytest.raises(ConfigError, match=f"{KEY}=2 does not divide the 1 process"):
        NativeRollout.from_config(model, [2], 2, torch.device("cpu"), None, cfg)
    with pytest.raises(ConfigError, match=f"{KEY}=2 does not divide the 1 process"):
        new_tp_group(2)
    cfg.name = "vllm"  # verl's names keep one model copy per process (later_work warns)
    r = NativeRollout.from_config(model, [2], 2, torch.device("cpu"), None, cfg)
    assert r.tp is None and not r.collective and r.weight_slices() == {}


def test_tp1_is_todays_engine(model, tiny_tokenizer):
    r = NativeRollout(model, [2], 2, torch.device("cpu"), progress=False)
    assert r.tp is None and not r.collective and r.weight_slices() == {}
    assert r._spec().num_heads == 4 and r._spec().num_kv_heads == 2

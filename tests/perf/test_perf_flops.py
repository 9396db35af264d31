"""FLOPs formula on a hand-counted config, MFU arithmetic, memory metrics."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlforge.perf.flops import forward_flops, mfu
from rlforge.perf.memory import memory_metrics


def test_forward_flops_hand_count():
    # 2 layers, h=8, 2 query heads of d=4, 1 kv head, MLP 16, vocab 10.
    cfg = SimpleNamespace(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=4, intermediate_size=16, vocab_size=10)
    per_layer = 8 * 4 * (2 + 2 * 1) + 2 * 4 * 8 + 3 * 8 * 16  # qkv + o + gated MLP = 128 + 64 + 384
    n = 2 * per_layer + 10 * 8
    seqlens = [3, 5]
    expected = 2 * n * 8 + 4 * 2 * 2 * 4 * (9 + 25)
    assert forward_flops(cfg, seqlens) == pytest.approx(expected)


def test_mfu_and_unknown_peak():
    assert mfu(4e12, 2.0, 1e12, num_devices=2) == pytest.approx(1.0)
    assert mfu(1.0, 1.0, None) is None


def test_memory_metrics_reports_cpu_rss():
    m = memory_metrics()
    assert 0.01 < m["perf/cpu_memory_used_gb"] < 24


def test_forward_flops_of_a_config_without_intermediate_size():
    """GPT-2 style configs (no ``intermediate_size``): counted with ``n_inner`` or 4 x hidden, not a crash."""
    from transformers import GPT2Config

    from rlforge.perf.flops import forward_flops

    c = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50)
    h, layers, vocab = 16, 2, 50
    params = layers * (h * 8 * (2 + 4) + 2 * 8 * h + 3 * h * 4 * h) + vocab * h
    assert forward_flops(c, [3]) == 2.0 * params * 3 + 4.0 * layers * 2 * 8 * 9


# The hand-counted config of test_forward_flops_hand_count: 2 layers, h=8, 2 query heads of d=4,
# 1 kv head, MLP 16, vocab 10; sequences of 3 and 5 tokens: T = 8, sum of squares = 34.
SMALL_CFG = SimpleNamespace(hidden_size=8, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                            head_dim=4, intermediate_size=16, vocab_size=10)
# Per layer: QKV 8*4*(2+2) = 128, O 2*4*8 = 64, MLP 3*8*16 = 384 -> 576; both layers 1152.
# LM head 10*8 = 80.  Attention of one forward: 4 * L 2 * n_q 2 * d 4 * 34 = 2176.
# Layers' matmuls of one forward: 2 * 1152 * 8 = 18432; the head's: 2 * 80 * 8 = 1280.


def test_train_flops_rlforge_convention():
    from rlforge.perf.flops import train_flops

    # 3 forwards of (18432 + 1280 + 2176) = 3 * 21888
    assert train_flops(SMALL_CFG, [3, 5], "rlforge") == 65664
    assert train_flops(SMALL_CFG, [5, 3]) == 65664  # the default, any order
    assert train_flops(SMALL_CFG, [3, 5], "rlforge", recompute=True, head_tokens=1) == 65664  # model FLOPs


def test_train_flops_verl_convention_is_verl_flops_counter():
    from rlforge.perf.flops import forward_flops, train_flops

    # verl's _estimate_qwen2_flops: dense_N = (mlp 384 + attn_linear 8*(8+4+4+8)=192) * 2 + emd_and_lm_head 2*10*8
    dense_n = (384 + 192) * 2 + 160  # 1312
    attn = 12 * 34 * 4 * 2 * 2  # 12 * seqlen_square_sum * head_dim * num_attention_heads * num_hidden_layers
    assert train_flops(SMALL_CFG, [3, 5], "verl") == 6 * dense_n * 8 + attn == 69504
    assert forward_flops(SMALL_CFG, [3, 5], "verl") == 69504 / 3
    # verl counts the embedding as a second V x h matmul: 6 * V * h * T more than ours
    assert 69504 - 65664 == 6 * 10 * 8 * 8


def test_train_flops_hfu_counts_the_recomputed_forward():
    from rlforge.perf.flops import forward_flops, train_flops

    assert train_flops(SMALL_CFG, [3, 5], "hfu") == 65664  # nothing recomputed: the model FLOPs
    # checkpointed layers: 4 forwards of (18432 + 2176) = 82432; the head 3 forwards: 3 * 1280 = 3840
    assert train_flops(SMALL_CFG, [3, 5], "hfu", recompute=True) == 86272
    # the head recomputed too (rlforge's chunked head), on the 5 response positions only: 4 * 2 * 80 * 5 = 3200
    assert train_flops(SMALL_CFG, [3, 5], "hfu", recompute=True, head_tokens=5, head_recompute=True) == 85632
    assert forward_flops(SMALL_CFG, [3, 5], "hfu", head_tokens=5) == 18432 + 2176 + 2 * 80 * 5


def test_unknown_convention():
    from rlforge.perf.flops import train_flops

    with pytest.raises(ValueError, match="expected one of rlforge, verl, hfu"):
        train_flops(SMALL_CFG, [3], "palm")  # type: ignore[arg-type]


def test_qwen2_config_reads_like_verl():
    """A real Qwen2Config (tied embeddings, GQA): the verl count is ours plus 6 * V * h per token."""
    from transformers import Qwen2Config

    from rlforge.perf.flops import Shape, train_flops

    c = Qwen2Config(hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True)
    s = Shape.of(c)
    assert (s.head_dim, s.n_kv, s.ffn, s.vocab) == (16, 2, 160, 300)
    assert train_flops(c, [7, 9], "verl") - train_flops(c, [7, 9]) == 6 * 300 * 64 * 16


def test_mfu_metrics_three_ways():
    from rlforge.trainer.metrics import mfu_metrics

    m = {"timing_s/update_actor": 2.0, "timing_s/ref": 1.0}
    out = mfu_metrics(m, [3, 5], SMALL_CFG, None, ppo_epochs=2, critic_ppo_epochs=1, peak=1000.0,
                      recompute=True, head_tokens=5, head_recompute=True)
    assert out["perf/mfu/actor"] == pytest.approx(2 * 65664 / 2.0 / 1000.0)
    assert out["perf/mfu/actor_verl"] == pytest.approx(2 * 69504 / 2.0 / 1000.0)
    assert out["perf/hfu/actor"] == pytest.approx(2 * 85632 / 2.0 / 1000.0)
    assert out["perf/mfu/ref"] == pytest.approx(21888 / 1.0 / 1000.0)
    assert mfu_metrics(m, [3, 5], SMALL_CFG, None, 1, 1, peak=None) == {}


def test_hfu_leaves_out_the_shared_prompt_copies():
    """Rows of 3 and 5 tokens sharing a 2-token prompt (responses 1 and 3): the shared layout runs
    6 tokens and an attention count of 2² + (2·1·2 + 1²) + (2·3·2 + 3²) = 30 instead of 8 and 34,
    i.e. ``saved_work=(2, 4)``.  Reference: ``hfu`` of two sequences with that total and that
    Σ s² (3 ± √6 tokens); the head's 5 positions and ``perf/mfu/*`` are unchanged."""
    from rlforge.perf.flops import train_flops
    from rlforge.trainer.metrics import mfu_metrics

    m = {"timing_s/update_actor": 2.0}
    kw = dict(recompute=True, head_tokens=5, head_recompute=True)
    plain = mfu_metrics(m, [3, 5], SMALL_CFG, None, 1, 1, peak=1000.0, **kw)
    shared = mfu_metrics(m, [3, 5], SMALL_CFG, None, 1, 1, peak=1000.0, saved_work=(2, 4), **kw)
    same = [3 + 6 ** 0.5, 3 - 6 ** 0.5]
    assert shared["perf/hfu/actor"] == pytest.approx(train_flops(SMALL_CFG, same, "hfu", **kw) / 2.0 / 1000.0)
    assert shared["perf/hfu/actor"] < plain["perf/hfu/actor"]
    assert shared["perf/mfu/actor"] == plain["perf/mfu/actor"]

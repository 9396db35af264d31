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

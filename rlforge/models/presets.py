"""Architecture presets with random ("dummy") weights, for tests and benchmarks.

``actor_rollout_ref.model.path=preset:NAME`` builds the model from the shapes below and
never downloads anything.  The shapes of the Qwen2.5 presets are the published ones
(Qwen2.5 technical report, Table 1, and each model's ``config.json``).  The vocabulary
is the larger of the preset's and the tokenizer's, so any tokenizer can drive a preset.
"""

from __future__ import annotations

from typing import Any

from transformers import LlamaConfig, PretrainedConfig, Qwen2Config

# name -> (config class, keyword arguments).  ``vocab_size`` is a minimum.
PRESETS: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    # A few-hundred-thousand-parameter Llama for CI: a training step takes well under a second.
    "tiny": (
        LlamaConfig,
        dict(
            hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
            vocab_size=0, rms_norm_eps=1e-6,
        ),
    ),
    "qwen2.5-0.5b": (
        Qwen2Config,
        dict(
            hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
            num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True,
            vocab_size=151936, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        ),
    ),
    "qwen2.5-1.5b": (
        Qwen2Config,
        dict(
            hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
            num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True,
            vocab_size=151936, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        ),
    ),
    "qwen2.5-3b": (
        Qwen2Config,
        dict(
            hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
            num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True,
            vocab_size=151936, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        ),
    ),
    "qwen2.5-7b": (
        Qwen2Config,
        dict(
            hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
            num_key_value_heads=4, max_position_embeddings=32768, tie_word_embeddings=False,
            vocab_size=152064, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        ),
    ),
    # Several-GPU models, for planning (``rlforge tune --gpus N``); building one takes its full memory.
    "qwen2.5-32b": (
        Qwen2Config,
        dict(
            hidden_size=5120, intermediate_size=27648, num_hidden_layers=64, num_attention_heads=40,
            num_key_value_heads=8, max_position_embeddings=32768, tie_word_embeddings=False,
            vocab_size=152064, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        ),
    ),
    "qwen2.5-72b": (
        Qwen2Config,
        dict(
            hidden_size=8192, intermediate_size=29568, num_hidden_layers=80, num_attention_heads=64,
            num_key_value_heads=8, max_position_embeddings=32768, tie_word_embeddings=False,
            vocab_size=152064, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
        ),
    ),
}


def preset_config(name: str, tokenizer_vocab_size: int, overrides: dict[str, Any] | None = None) -> PretrainedConfig:
    """The transformers config of preset ``name``.

    Args:
        name: a key of :data:`PRESETS`.
        tokenizer_vocab_size: ``len(tokenizer)``; the vocabulary is at least this large.
        overrides: ``actor_rollout_ref.model.override_config`` entries applied last.

    Raises:
        KeyError: if ``name`` is unknown (the loader turns this into a ModelError).
    """
    cls, kwargs = PRESETS[name]
    kw = dict(kwargs)
    kw["vocab_size"] = max(int(kw["vocab_size"]), int(tokenizer_vocab_size))
    kw.update(overrides or {})
    return cls(**kw)

"""Model and tokenizer loading (HF folders, GGUF, the default model, presets)."""

from rlforge.models.loader import (
    DEFAULT_MODEL,
    ModelSource,
    load_causal_lm,
    load_tokenizer,
    load_value_model,
    resolve_source,
)
from rlforge.models.presets import PRESETS

__all__ = [
    "DEFAULT_MODEL",
    "PRESETS",
    "ModelSource",
    "load_causal_lm",
    "load_tokenizer",
    "load_value_model",
    "resolve_source",
]

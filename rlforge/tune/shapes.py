"""The numbers of a decoder-only model that the memory and time models need, read without building it.

:func:`model_shape` reads ``preset:NAME`` from :data:`rlforge.models.presets.PRESETS` and a Hugging Face
folder from its ``config.json`` (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``,
``num_key_value_heads``, ``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``).  Qwen2's Q/K/V
projections carry biases (``attention_bias`` for Llama-like configs, default false).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlforge.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer's shapes.

    Attributes:
        hidden: ``h``; layers: ``L``; heads / kv_heads: query and key/value heads; head_dim: ``d``;
        intermediate: MLP width ``f`` (gated: three matrices); vocab: ``V``; tied: the LM head is the
        embedding; qkv_bias: Q/K/V projections have biases (Qwen2).
    """

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool = True
    qkv_bias: bool = False

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        """Parameters of one decoder layer: Q/K/V/O, the gated MLP, two RMSNorm weights."""
        h, q = self.hidden, self.heads * self.head_dim
        attn = h * q + 2 * h * self.kv_dim + q * h + (q + 2 * self.kv_dim if self.qkv_bias else 0)
        return attn + 3 * h * self.intermediate + 2 * h

    @property
    def packed_params(self) -> int:
        """Parameters the native rollout packs per layer into one Q/K/V and one gate/up matrix (all layers)."""
        h = self.hidden
        return self.layers * (h * (self.heads * self.head_dim + 2 * self.kv_dim) + 2 * h * self.intermediate)

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def root_params(self) -> int:
        """Embedding, final norm and (untied) LM head: FSDP's root unit."""
        return self.embed_params + self.hidden + (0 if self.tied else self.vocab * self.hidden)

    @property
    def params(self) -> int:
        """All parameters."""
        return self.layers * self.layer_params + self.root_params

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """KV-cache bytes of one token over all layers (K and V)."""
        return 2 * self.layers * self.kv_dim * dtype_bytes


def shape_from_hf(c: dict[str, Any], min_vocab: int = 0) -> ModelShape:
    """:class:`ModelShape` from a ``config.json`` mapping (``min_vocab``: the tokenizer's size)."""
    heads = int(c["num_attention_heads"])
    hidden = int(c["hidden_size"])
    mtype = str(c.get("model_type", ""))
    return ModelShape(
        hidden=hidden, layers=int(c["num_hidden_layers"]), heads=heads,
        kv_heads=int(c.get("num_key_value_heads") or heads), head_dim=int(c.get("head_dim") or hidden // heads),
        intermediate=int(c["intermediate_size"]), vocab=max(int(c["vocab_size"]), min_vocab),
        tied=bool(c.get("tie_word_embeddings", False)),
        qkv_bias=bool(c.get("attention_bias", mtype == "qwen2")),
    )


def model_shape(path: str, min_vocab: int = 0) -> ModelShape:
    """The shape of ``actor_rollout_ref.model.path``: ``preset:NAME``, a folder with ``config.json``, or what
    the model loader reads (the default model's name, a ``.gguf`` file, a Hub id in the cache: its folder).

    Raises:
        ConfigError: an unknown preset, or a path without a readable ``config.json``.
    """
    if path.startswith("preset:"):
        from rlforge.models.presets import PRESETS

        name = path.removeprefix("preset:")
        if name not in PRESETS:
            raise ConfigError(f"model path {path}: unknown preset; presets: {', '.join(PRESETS)}")
        cls, kw = PRESETS[name]
        return shape_from_hf({**kw, "model_type": getattr(cls, "model_type", "")}, max(min_vocab, 1))
    file = _hf_config_file(path)
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError) as e:
        raise ConfigError(f"model path {path}: cannot read {file} for the tuner's memory model ({e})") from None
    try:
        return shape_from_hf(data, min_vocab)
    except KeyError as e:
        raise ConfigError(f"{file}: no {e.args[0]} (the tuner models decoder-only transformers)") from None


def _hf_config_file(path: str) -> Path:
    """``config.json`` of the model at ``path``: in the folder itself, else in the folder the model loader
    reads for it (:func:`rlforge.models.loader.resolve_source`; a GGUF file is converted once, as training
    would at its start).  A path the loader cannot resolve keeps the plain folder's file (its error names it)."""
    file = Path(path).expanduser() / "config.json"
    if file.is_file():
        return file
    from rlforge.errors import ModelError
    from rlforge.models.loader import _hf_folder, resolve_source

    try:
        return Path(_hf_folder(resolve_source(path))) / "config.json"
    except ModelError:
        return file

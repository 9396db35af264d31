"""One pipeline stage of a Llama/Qwen2-style Hugging Face model, owned explicitly.

The model's own ``forward`` cannot run a slice of the layers, so each stage is a
:class:`StageModule` that *holds* the HF submodules of its part (the model classes are not
changed or patched) and runs them in the HF order:

* first stage: ``model.embed_tokens``;
* its decoder layers ``model.layers[i]`` for ``i`` in the stage's range, each called as the HF
  model calls it (causal mask from ``transformers.masking_utils``, rotary embeddings from the
  model's own ``rotary_emb``, per-layer sliding-window masks where the config has them);
* last stage: ``model.norm`` and the head: ``lm_head`` (causal LM) or ``dropout`` + ``score``
  (``*ForTokenClassification``, the value model).

Attribute names mirror the HF model (``model.layers`` is a ``ModuleDict`` keyed by the global
layer index, as torchtitan does), so a stage's ``state_dict`` keys are the HF keys.

A stage maps ``(input_ids or hidden (batch, seq_local, hidden_size), attention_mask (batch,
seq), position_ids (batch, seq))`` to ``hidden`` (middle stages, cast to ``act_dtype``) or the
head's output ``(batch, seq, V_local)`` (last stage; under tensor parallelism a local vocabulary
slice).  ``seq_local`` is ``seq / tp`` under sequence parallelism, else ``seq``.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask


def stage_layer_ids(num_layers: int, num_stages: int, stage: int) -> range:
    """The decoder layers of ``stage`` (equal contiguous blocks; ``num_stages`` divides ``num_layers``)."""
    per = num_layers // num_stages
    return range(stage * per, (stage + 1) * per)


def rank_stage_ids(pp_rank: int, pp: int, vpp: int) -> list[int]:
    """Stages held by pipeline rank ``pp_rank``: ``pp_rank, pp_rank + pp, ...`` (the "loop"
    placement that ``ScheduleInterleaved1F1B`` expects)."""
    return [pp_rank + k * pp for k in range(vpp)]



def _mask_kwargs(config: Any, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor,
                 position_ids: torch.Tensor) -> dict[str, Any]:
    """Keyword arguments of transformers' ``create_causal_mask`` for a full, cache-less sequence.

    The signature changed across transformers 5.x (``cache`` was ``past_key_values``,
    ``inputs_embeds`` was ``input_embeds``, and older releases also take ``cache_position``),
    so the names are read from the installed function.
    """
    params = inspect.signature(create_causal_mask).parameters
    kw: dict[str, Any] = {"config": config, "attention_mask": attention_mask, "position_ids": position_ids}
    kw["inputs_embeds" if "inputs_embeds" in params else "input_embeds"] = inputs_embeds
    kw["cache" if "cache" in params else "past_key_values"] = None
    if "cache_position" in params:
        kw["cache_position"] = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return kw

class StageModule(nn.Module):
    """A contiguous block of a HF decoder model (see the module docstring).

    Args:
        hf_model: ``*ForCausalLM`` or ``*ForTokenClassification`` with ``.model.layers``.
        layer_ids: the global indices of this stage's decoder layers.
        is_first, is_last: whether the stage holds the embedding / the norm and head.
        act_dtype: dtype of the hidden states sent to the next stage.
    Raises:
        ValueError: a model without ``.model.embed_tokens/.layers/.norm/.rotary_emb`` or head.
    """

    def __init__(self, hf_model: nn.Module, layer_ids: range, is_first: bool, is_last: bool,
                 act_dtype: torch.dtype) -> None:
        super().__init__()
        inner = getattr(hf_model, "model", None)
        needed = ("embed_tokens", "layers", "norm", "rotary_emb")
        if inner is None or not all(hasattr(inner, n) for n in needed):
            raise ValueError(f"strategy=megatron splits Llama/Qwen2-style models (.model.{{{','.join(needed)}}}); "
                             f"got {type(hf_model).__name__}")
        self.config = hf_model.config
        self.is_first, self.is_last = is_first, is_last
        self.act_dtype = act_dtype
        self.model = nn.Module()
        if is_first:
            self.model.embed_tokens = inner.embed_tokens
        self.model.layers = nn.ModuleDict({str(i): inner.layers[i] for i in layer_ids})
        self.model.rotary_emb = inner.rotary_emb
        self.layer_types = {str(i): _layer_type(self.config, i) for i in layer_ids}
        self.head_kind = ""
        if is_last:
            self.model.norm = inner.norm
            if hasattr(hf_model, "lm_head"):
                self.lm_head = hf_model.lm_head
                self.head_kind = "lm"
            elif hasattr(hf_model, "score"):
                self.dropout = getattr(hf_model, "dropout", nn.Identity())
                self.score = hf_model.score
                self.head_kind = "score"
            else:
                raise ValueError(f"{type(hf_model).__name__} has neither lm_head nor score")

    def _masks(self, ref: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> dict[str, Any]:
        shape = ref.new_empty((attention_mask.shape[0], attention_mask.shape[1], 0))  # the full sequence
        kw = _mask_kwargs(config=self.config, inputs_embeds=shape, attention_mask=attention_mask,
                          position_ids=position_ids)
        masks: dict[str, Any] = {"full_attention": create_causal_mask(**kw)}
        if "sliding_attention" in self.layer_types.values():
            masks["sliding_attention"] = create_sliding_window_causal_mask(**kw)
        return masks

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        h = self.model.embed_tokens(x) if self.is_first else x
        masks = self._masks(h, attention_mask, position_ids)
        pos_emb = self.model.rotary_emb(h, position_ids)
        for idx, layer in self.model.layers.items():
            h = layer(h, attention_mask=masks[self.layer_types[idx]], position_ids=position_ids,
                      position_embeddings=pos_emb)
        if not self.is_last:
            return h.to(self.act_dtype)
        h = self.model.norm(h)
        if self.head_kind == "lm":
            return self.lm_head(h)
        if isinstance(h, DTensor):  # sequence-parallel norm: the (replicated) value head needs all positions
            h = h.full_tensor()
        return self.score(self.dropout(h))


def _layer_type(config: Any, i: int) -> str:
    types = getattr(config, "layer_types", None)
    return str(types[i]) if types else "full_attention"

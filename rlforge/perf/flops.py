"""Training FLOPs of a decoder-only transformer, MFU and HFU, in three conventions.

For ``L`` layers, hidden size ``h``, ``n_q`` query heads and ``n_kv`` key/value heads of size
``d``, MLP width ``f`` (gated: three matrices) and vocabulary ``V``, over sequences of lengths
``s_i`` (``T = Σ s_i`` tokens, ``S2 = Σ s_i²``):

    N_layers = L · (h·d·(n_q + 2·n_kv) + n_q·d·h + 3·h·f)      (QKV, O and MLP matrices)
    N_head   = V·h                                                (the LM head)
    A        = 4·L·n_q·d·S2                                       (QKᵀ and AV of one forward,
                                                                   the full s×s, 2 FLOPs per MAC)

A matmul costs 2 FLOPs per multiply-add and per token in forward and twice that in backward
(the gradients of input and weight), so a training pass is three forwards.  The conventions
(:data:`CONVENTIONS`), FLOPs of one pass of forward + backward over the batch:

``rlforge`` (model FLOPs, our MFU)
    ``3 · (2·(N_layers + N_head)·T + A)``.  The embedding is a lookup, not a matmul, so it
    costs nothing; the LM head counts once whether or not it is tied to the embedding.
``verl`` (model FLOPs, verl's MFU)
    ``6·(N_layers + 2·V·h)·T + 3·A``: verl's ``FlopsCounter`` (``verl/utils/flops_counter.py``,
    ``_estimate_qwen2_flops``, used for Qwen2/Qwen3/Llama/Mistral) counts the embedding as a
    second ``V×h`` matmul (``emd_and_lm_head_N = vocab_size * hidden_size * 2``), hence
    ``2·V·T·h`` forward FLOPs more than ``rlforge``; the attention term ``12·S2·d·n_q·L`` is the
    same.  verl applies this formula only to the model types it lists (others give 0); here it
    is applied to any config with the fields below.
``hfu`` (hardware FLOPs)
    what the device executes, counting the recomputed forward of activation checkpointing:
    ``k·(2·N_layers·T + A) + k_head·2·V·h·T_head``, with ``k = 4`` when the decoder layers are
    checkpointed (forward, recomputed forward, backward = 2) else 3, ``k_head = 4`` when the head
    is recomputed in backward (rlforge's chunked LM head, ``model.use_fused_kernels``) else 3,
    and ``T_head`` the positions whose logits are computed (all ``T`` by default; rlforge's
    chunked head and TRL's ``logits_to_keep`` compute the response positions only).  Attention
    stays counted as above (full s×s, backward = 2 forwards): the extra QKᵀ that a fused
    attention kernel recomputes inside its backward, and the masked half that a causal kernel
    skips, are not modelled.

MFU and HFU = FLOPs ÷ seconds ÷ (device peak × devices), with the bf16 dense peak of
:data:`PEAK_BF16_FLOPS` for all three.  The attention term counts the full s×s product, as
verl and the PaLM paper (Chowdhery et al. 2022, App. B) do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

Convention = Literal["rlforge", "verl", "hfu"]
CONVENTIONS: tuple[str, ...] = get_args(Convention)
"""The FLOPs conventions of :func:`train_flops` and :func:`forward_flops` (see the module docstring)."""

# Dense bf16 peak, FLOP/s, per device, from the vendors' datasheets (no sparsity).
PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100": 989e12,
    "H800": 989e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "A10": 125e12,
}


def peak_flops_for_name(device_name: str) -> float | None:
    """The bf16 dense peak (FLOP/s) of a GPU by its name (``"NVIDIA H200"``), or None when the
    name matches no entry of :data:`PEAK_BF16_FLOPS`."""
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return peak
    return None


def device_peak_flops(device: torch.device | None = None) -> float | None:
    """The bf16 dense peak of the current CUDA device from :data:`PEAK_BF16_FLOPS`, or None
    (CPU, or a GPU not in the table: MFU is then not reported)."""
    if not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return None
    return peak_flops_for_name(torch.cuda.get_device_name(device))


@dataclass(frozen=True)
class Shape:
    """The sizes of a decoder-only transformer that the FLOPs depend on (see the module docstring)."""

    layers: int
    hidden: int
    n_q: int
    n_kv: int
    head_dim: int
    ffn: int
    vocab: int

    @classmethod
    def of(cls, config: Any) -> Shape:
        """From a transformers config (its ``text_config`` when it has one): ``hidden_size``,
        ``num_hidden_layers``, ``num_attention_heads``, optional ``num_key_value_heads`` and
        ``head_dim``, ``intermediate_size`` and ``vocab_size``.  The MLP is counted as gated
        (three ``hidden x intermediate`` matrices, Llama/Qwen); a config without
        ``intermediate_size`` (GPT-2 style) is counted with ``n_inner`` or ``4 * hidden``."""
        c = getattr(config, "text_config", None) or config
        h, n_q = int(c.hidden_size), int(c.num_attention_heads)
        return cls(
            layers=int(c.num_hidden_layers), hidden=h, n_q=n_q,
            n_kv=int(getattr(c, "num_key_value_heads", None) or n_q),
            head_dim=int(getattr(c, "head_dim", None) or h // n_q),
            ffn=int(getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * h),
            vocab=int(c.vocab_size),
        )

    @property
    def layer_params(self) -> int:
        """``N_layers``: weights of all decoder layers' matmuls (no norms, no biases)."""
        h, d = self.hidden, self.head_dim
        return self.layers * (h * d * (self.n_q + 2 * self.n_kv) + self.n_q * d * h + 3 * h * self.ffn)

    @property
    def head_params(self) -> int:
        """``N_head = V·h``: the LM head."""
        return self.vocab * self.hidden

    def attention_flops(self, seqlens: Sequence[float]) -> float:
        """``A = 4·L·n_q·d·Σ s_i²``: QKᵀ and AV of one forward over the full s×s."""
        return 4.0 * self.layers * self.n_q * self.head_dim * sum(float(s) ** 2 for s in seqlens)


def _check(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise ValueError(f"unknown FLOPs convention {convention!r}; expected one of {', '.join(CONVENTIONS)}")


def forward_flops(config: Any, seqlens: Sequence[float], convention: Convention = "rlforge", *,
                  head_tokens: float | None = None) -> float:
    """FLOPs of one forward pass (no gradient: log-probs, reference, values) over sequences of
    the given lengths.

    Args:
        config: a transformers config (fields: :meth:`Shape.of`).
        seqlens: tokens of each sequence (prompt + response, no padding), any order.
        convention: ``rlforge`` ``2·(N_layers + N_head)·T + A``; ``verl``
            ``2·(N_layers + 2·N_head)·T + A``; ``hfu`` ``2·N_layers·T + A + 2·N_head·T_head``.
        head_tokens: ``T_head`` for ``hfu``, the positions whose logits are computed; None = ``T``.
            The model-FLOPs conventions always count the head on every token.

    Returns:
        FLOPs (a float; divide by seconds for FLOP/s).
    """
    _check(convention)
    shape = Shape.of(config)
    tokens = float(sum(float(s) for s in seqlens))
    layers = 2.0 * shape.layer_params * tokens + shape.attention_flops(seqlens)
    if convention == "rlforge":
        return layers + 2.0 * shape.head_params * tokens
    if convention == "verl":
        return layers + 4.0 * shape.head_params * tokens
    return layers + 2.0 * shape.head_params * (tokens if head_tokens is None else float(head_tokens))


def train_flops(config: Any, seqlens: Sequence[float], convention: Convention = "rlforge", recompute: bool = False,
                *, head_tokens: float | None = None, head_recompute: bool = False) -> float:
    """FLOPs of one forward + backward pass over sequences of the given lengths (multiply by
    the PPO epochs for an update that passes over the batch several times).

    Args:
        config: a transformers config (fields: :meth:`Shape.of`).
        seqlens: tokens of each sequence (prompt + response, no padding), any order.
        convention: ``rlforge`` / ``verl`` (model FLOPs: 3 forwards, whatever the implementation
            recomputes) or ``hfu`` (hardware FLOPs); formulas in the module docstring.
        recompute: ``hfu`` only: the decoder layers are activation-checkpointed
            (``model.enable_gradient_checkpointing``), so their forward runs twice: 4 forwards.
        head_tokens: ``hfu`` only: ``T_head``, the positions whose logits are computed; None = ``T``.
        head_recompute: ``hfu`` only: the LM head's forward is recomputed in backward
            (rlforge's chunked head): 4 head forwards instead of 3.

    Returns:
        FLOPs (a float).

    Raises:
        ValueError: an unknown ``convention``.
    """
    _check(convention)
    if convention != "hfu":
        return 3.0 * forward_flops(config, seqlens, convention)
    shape = Shape.of(config)
    tokens = float(sum(float(s) for s in seqlens))
    t_head = tokens if head_tokens is None else float(head_tokens)
    layers = 2.0 * shape.layer_params * tokens + shape.attention_flops(seqlens)
    return (4.0 if recompute else 3.0) * layers + (4.0 if head_recompute else 3.0) * 2.0 * shape.head_params * t_head


def shared_prompt_flops(config: Any, saved_tokens: float, saved_s2: float, recompute: bool = False) -> float:
    """Hardware FLOPs of forward + backward that the shared-prompt layout
    (``actor.use_prefix_grouper``) does not execute: ``k · (2·N_layers·ΔT + 4·L·n_q·d·ΔS2)``
    with ``k`` as in ``hfu`` (4 checkpointed, else 3), for ``saved_tokens`` = ΔT decoder-layer
    tokens and ``saved_s2`` = ΔS2 of the full s×s attention count not computed
    (:attr:`rlforge.engine.packing.PackPlan.saved`).  The LM head is not involved: it runs on the
    response positions either way.  Subtract it from :func:`train_flops` ``(convention="hfu")``."""
    shape = Shape.of(config)
    layers = 2.0 * shape.layer_params * float(saved_tokens) + 4.0 * shape.layers * shape.n_q * shape.head_dim * float(
        saved_s2)
    return (4.0 if recompute else 3.0) * layers


def mfu(flops: float, seconds: float, peak: float | None, num_devices: int = 1) -> float | None:
    """FLOPs utilisation in [0, 1] (MFU for model FLOPs, HFU for hardware FLOPs): ``flops``
    done in ``seconds`` on ``num_devices`` devices of ``peak`` FLOP/s each; None when the peak
    is unknown or no time passed."""
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / (peak * num_devices)

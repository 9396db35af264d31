"""Model FLOPs and MFU (model FLOPs utilisation), as verl's ``FlopsCounter`` counts them.

For a decoder-only transformer with ``L`` layers, hidden size ``h``, ``n_q`` query heads
and ``n_kv`` key/value heads of size ``d``, MLP width ``f`` (gated: three matrices) and
vocabulary ``V``, the parameters that multiply every token are

    N = L · (h·d·(n_q + 2·n_kv) + n_q·d·h + 3·h·f) + V·h        (attention, MLP, LM head)

and one forward pass over sequences of lengths ``s_i`` costs

    2·N·Σ s_i  +  4·L·n_q·d·Σ s_i²        (matmuls; QKᵀ and AV over full s×s)

A training step (forward + backward) is three forwards.  The attention term counts the
full s×s product, as verl and the PaLM paper (Chowdhery et al. 2022, App. B) do, so MFU
is comparable with theirs.  MFU = achieved FLOP/s ÷ (device peak × devices).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

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


def device_peak_flops(device: torch.device | None = None) -> float | None:
    """The bf16 dense peak of the current CUDA device from :data:`PEAK_BF16_FLOPS`, or None
    (CPU, or a GPU not in the table: MFU is then not reported)."""
    if not torch.cuda.is_available() or (device is not None and device.type != "cuda"):
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in name:
            return peak
    return None


def _text_config(config: Any) -> Any:
    return getattr(config, "text_config", None) or config


def forward_flops(config: Any, seqlens: Sequence[int]) -> float:
    """FLOPs of one forward pass over sequences of the given lengths (tokens).

    ``config`` is a transformers config with ``hidden_size``, ``num_hidden_layers``,
    ``num_attention_heads``, optional ``num_key_value_heads`` and ``head_dim``,
    ``intermediate_size`` and ``vocab_size``.  The MLP is counted as gated (three
    ``hidden x intermediate`` matrices, Llama/Qwen); a config without ``intermediate_size``
    (GPT-2 style) is counted with ``n_inner`` or ``4 * hidden``.
    """
    c = _text_config(config)
    h, layers, n_q = int(c.hidden_size), int(c.num_hidden_layers), int(c.num_attention_heads)
    n_kv = int(getattr(c, "num_key_value_heads", None) or n_q)
    d = int(getattr(c, "head_dim", None) or h // n_q)
    f = int(getattr(c, "intermediate_size", None) or getattr(c, "n_inner", None) or 4 * h)
    vocab = int(c.vocab_size)
    n_params = layers * (h * d * (n_q + 2 * n_kv) + n_q * d * h + 3 * h * f) + vocab * h
    tokens = float(sum(seqlens))
    sq = float(sum(int(s) ** 2 for s in seqlens))
    return 2.0 * n_params * tokens + 4.0 * layers * n_q * d * sq


def mfu(flops: float, seconds: float, peak: float | None, num_devices: int = 1) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None when the peak is unknown."""
    if peak is None or seconds <= 0:
        return None
    return flops / seconds / (peak * num_devices)

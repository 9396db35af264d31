"""Regional ``torch.compile`` of the decoder layers' elementwise-heavy parts (``actor.use_torch_compile``).

In the training step, eager PyTorch runs each RMSNorm as about ten kernels (the float32
upcast, the variance, ``rsqrt``, two products, the cast back) and the gated MLP's
``silu(gate) * up`` as three, each reading and writing the whole activation, and as many
again in backward.  Compiling these submodules lets Inductor fuse each chain into one or
two kernels, forward and backward.  Only the MLP and the norms of each decoder layer are
compiled (torchtitan's per-block "regional" compile, narrowed further): attention stays
eager, so the packed varlen kernel, transformers' attention dispatch and the KV-free
training forward are untouched, and there are no graph breaks to hunt.  ``dynamic=True``:
packed micro-batches have a different token count each time, and one graph serves them all.

Applied in place with ``nn.Module.compile`` (state-dict keys unchanged), after the
checkpoint/offload wrappers and before sharding.  CUDA only: on CPU nothing is compiled
(the CPU tests and smoke runs keep the eager reference path).
"""

from __future__ import annotations

import torch
from torch import nn

from rlforge.engine.activation import decoder_layers

COMPILED_CHILDREN = ("mlp", "input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm")
"""Children of a decoder layer that are compiled when present (HF Llama/Qwen/Mistral/Gemma names)."""


def compile_layers(module: nn.Module, device: torch.device) -> int:
    """Compile the :data:`COMPILED_CHILDREN` of every decoder layer of ``module`` in place.

    Returns the number of submodules compiled (0 on a non-CUDA ``device``).

    Raises:
        ValueError: the decoder layers cannot be found (see ``decoder_layer_list``).
    """
    if device.type != "cuda":
        return 0
    count = 0
    for layer in decoder_layers(module):
        inner = getattr(layer, "_checkpoint_wrapped_module", layer)
        for name in COMPILED_CHILDREN:
            child = getattr(inner, name, None)
            if isinstance(child, nn.Module):
                child.compile(dynamic=True)
                count += 1
    return count

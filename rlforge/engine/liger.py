"""liger-kernel's fused Triton kernels in the trained model (``actor_rollout_ref.model.use_liger``).

Eager PyTorch runs a decoder layer's RMSNorm as about ten elementwise kernels forward (float32
upcast, variance, ``rsqrt``, products, the cast back), the gated MLP's ``silu(gate) * up`` as
three and rotary embedding as about eight, each reading and writing the whole activation, and
as many again in backward.  On small models such as Qwen2.5-0.5B the step is then bound by kernel
launches (a profile of the 0.5B update at a 16k-token budget showed the GPU idle 51% of the
step, with elementwise kernels 56% of its busy time).  liger-kernel (LinkedIn, Apache-2.0;
https://github.com/linkedin/Liger-Kernel) replaces each chain with one Triton kernel forward and
one backward.  verl's ``model.use_liger`` applies the same library.

Applied in place to the HF model instance before it is copied for the reference and the rollout
and before sharding: RMSNorm, SwiGLU MLP and RoPE only.  Liger's fused linear + cross-entropy is
not used: rlforge's chunked head (``model.use_fused_kernels``) computes the log-probs.  Parameter
names and the state dict are unchanged, so checkpoints and exports do not depend on the key.
The RoPE patch replaces the module-level ``apply_rotary_pos_emb`` of the model's transformers
module, so every instance of that architecture in the process uses it (as in verl).
"""

from __future__ import annotations

import importlib.util
import warnings

import torch
from torch import nn

from rlforge.errors import RLForgeWarning

LIGER_OPS = {"rope": True, "rms_norm": True, "swiglu": True, "cross_entropy": False,
             "fused_linear_cross_entropy": False}
"""The liger-kernel patches applied (keyword arguments of its ``apply_liger_kernel_to_<model>``)."""


def liger_available() -> bool:
    """True when liger-kernel is installed and a CUDA GPU is visible (its kernels are Triton, GPU only)."""
    return importlib.util.find_spec("liger_kernel") is not None and torch.cuda.is_available()


def apply_liger(module: nn.Module, device: torch.device, key: str = "actor_rollout_ref.model.use_liger") -> bool:
    """Patch ``module`` (a transformers causal LM) in place with :data:`LIGER_OPS`.

    Returns True when the kernels were applied; False on a non-CUDA ``device`` or without
    liger-kernel (``config/later_work.py`` warns about ``key`` then), or, with a warning naming
    ``key``, when liger-kernel has no patch for the model's ``config.model_type``.
    """
    if device.type != "cuda" or not liger_available():
        return False
    from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

    model_type = getattr(getattr(module, "config", None), "model_type", None)
    apply_fn = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type or "")
    if apply_fn is None:
        warnings.warn(f"{key}=True: liger-kernel has no kernels for model_type {model_type!r}; using the eager "
                      "modules", category=RLForgeWarning, stacklevel=2)
        return False
    import inspect

    accepted = inspect.signature(apply_fn).parameters
    apply_fn(model=module, **{k: v for k, v in LIGER_OPS.items() if k in accepted})
    return True

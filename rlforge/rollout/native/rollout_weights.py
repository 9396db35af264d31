"""The GEMM weights the native rollout reads: packed, and in the compute dtype.

Two costs of reading the trainer's module as it is, both measured on an H200
(``benchmarks/history/RESULTS-log.md``, 2026-12-01):

- **Five GEMMs where two do.**  Q, K and V project the same rows, as do gate and up.  At
  decode batch sizes the K and V GEMMs move a few megabytes and cost their launch and a
  poorly filled grid more than their bytes: three Q/K/V GEMMs took 39-47 µs per layer where
  one packed GEMM took 13-27 µs (M = 128-1,024 rows; Qwen2.5 0.5B, 1.5B, 7B shapes), i.e.
  0.65-0.95 ms per decode step over all layers.  ``pack=True`` keeps ``[q; k; v]`` and
  ``[gate; up]`` as one matrix each.
- **A cast per GEMM per step.**  The trainer keeps float32 master weights and runs under
  bfloat16 autocast; autocast casts every weight again in every forward (a decode step of a
  1.5B model would read 6 GB of float32 weights to write and re-read 3 GB of bfloat16
  copies).  Here the weights are cast once per generation.

Both are copies, refreshed by :meth:`RolloutWeights.refresh` before every generation (the
trainer updates its parameters in place between generations); the copies keep their addresses,
so captured CUDA graphs stay valid.  A weight neither packed nor cast is the module's own tensor
(no copy).  The copies are the rounding autocast applies (round to nearest even), so the
GEMMs see the same operands as the trainer's forward; norms and the embedding stay the
module's tensors (the trainer's forward multiplies and looks them up in their own dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

Linear = tuple[torch.Tensor, torch.Tensor | None]
"""``(weight [out, in], bias [out] or None)`` as :func:`torch.nn.functional.linear` takes them."""


@dataclass
class Slot:
    """One GEMM operand: the module linears it is made of, and its tensors (copies or the module's own)."""

    parts: list[nn.Module]
    copy: bool
    weight: torch.Tensor
    bias: torch.Tensor | None

    @property
    def linear(self) -> Linear:
        return self.weight, self.bias

    @property
    def sizes(self) -> list[int]:
        """Output rows of each part (how a packed output splits)."""
        return [p.weight.shape[0] for p in self.parts]


def _plan(parts: list[nn.Module], dtype: torch.dtype, pack: bool) -> list[tuple[list[nn.Module], bool]]:
    """``(linears, copied)`` per slot for ``parts`` (linears reading the same input): one packed
    copy when ``pack`` and there are several, else one slot per linear, copied only when its
    dtype is not ``dtype``."""
    if pack and len(parts) > 1:
        return [(parts, True)]
    return [([p], p.weight.dtype != dtype) for p in parts]


def _slots(parts: list[nn.Module], dtype: torch.dtype, pack: bool) -> list[Slot]:
    """The slots of :func:`_plan`, copies allocated (filled by :meth:`RolloutWeights.refresh`)."""
    out = []
    for group, copied in _plan(parts, dtype, pack):
        w0 = group[0].weight
        if not copied:
            out.append(Slot(group, False, w0, group[0].bias))
            continue
        rows = sum(p.weight.shape[0] for p in group)
        has_bias = any(p.bias is not None for p in group)
        out.append(Slot(group, True, torch.empty((rows, w0.shape[1]), dtype=dtype, device=w0.device),
                        torch.zeros(rows, dtype=dtype, device=w0.device) if has_bias else None))
    return out


def _groups(module: nn.Module) -> list[list[nn.Module]]:
    """Per layer ``[q, k, v]``, ``[o]``, ``[gate, up]``, ``[down]``, then ``[lm_head]``."""
    out = []
    for layer in module.model.layers:
        att, mlp = layer.self_attn, layer.mlp
        out += [[att.q_proj, att.k_proj, att.v_proj], [att.o_proj], [mlp.gate_proj, mlp.up_proj], [mlp.down_proj]]
    return [*out, [module.lm_head]]


@dataclass
class LayerWeights:
    """One decoder layer's GEMM operands: ``qkv`` (one packed or three), ``o``, ``gate_up``
    (one packed or two), ``down``."""

    qkv: list[Slot]
    o: Slot
    gate_up: list[Slot]
    down: Slot


class RolloutWeights:
    """The runner's GEMM weights for ``module`` (a Llama/Qwen2-family causal LM) in ``dtype``.

    Args:
        module: the model whose ``model.layers[i].self_attn.{q,k,v,o}_proj``,
            ``mlp.{gate,up,down}_proj`` and ``lm_head`` are read.
        dtype: the compute dtype (autocast's, or the module's own).
        pack: keep Q/K/V and gate/up packed (see the module docstring).
    """

    def __init__(self, module: nn.Module, dtype: torch.dtype, pack: bool) -> None:
        self.module, self.dtype, self.pack = module, dtype, pack
        groups = [_slots(g, dtype, pack) for g in _groups(module)]
        self.layers = [LayerWeights(groups[i], groups[i + 1][0], groups[i + 2], groups[i + 3][0])
                       for i in range(0, len(groups) - 1, 4)]
        self.lm_head = groups[-1][0]
        self.refresh()

    def _all_slots(self) -> list[Slot]:
        out = [self.lm_head]
        for lw in self.layers:
            out += [*lw.qkv, lw.o, *lw.gate_up, lw.down]
        return out

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the module's current weights into the copies (in place; the module's own
        tensors need nothing).  Raises RuntimeError when a module weight is no longer the
        tensor a reference slot holds (the caller must build new weights: new tensors)."""
        for s in self._all_slots():
            if not s.copy:
                if s.weight is not s.parts[0].weight:
                    raise RuntimeError("the module's weights are new tensors; build new RolloutWeights")
                continue
            row = 0
            for p in s.parts:
                n = p.weight.shape[0]
                s.weight[row:row + n].copy_(p.weight)
                if s.bias is not None and p.bias is not None:
                    s.bias[row:row + n].copy_(p.bias)
                row += n

    def copy_bytes(self) -> int:
        """Bytes held by the copies (beyond the module's own weights)."""
        return sum(s.weight.nbytes + (0 if s.bias is None else s.bias.nbytes) for s in self._all_slots() if s.copy)

    @staticmethod
    def planned_bytes(module: nn.Module, dtype: torch.dtype, pack: bool) -> int:
        """:meth:`copy_bytes` of ``RolloutWeights(module, dtype, pack)``, without allocating."""
        size = torch.empty((), dtype=dtype).element_size()
        total = 0
        for g in _groups(module):
            for group, copied in _plan(g, dtype, pack):
                if copied:
                    bias = any(p.bias is not None for p in group)
                    total += sum(p.weight.numel() + (p.weight.shape[0] if bias else 0) for p in group) * size
        return total

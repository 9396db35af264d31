"""FSDP2 engine (``strategy=fsdp2``): ``fully_shard`` per decoder layer, then the root.

Order of construction (as torchtitan's ``parallelize.py``), on the UNSHARDED module:

1. dtype of the master parameters (``fsdp_config.model_dtype``, default fp32);
2. activation checkpointing / offload wrappers on each decoder layer
   (:mod:`rlforge.engine.activation`);
3. ``fully_shard`` on each decoder layer, on each module marked ``keep_fp32`` (a policy loss's log Z
   head: its own unit with master weights and compute in float32, whatever the compute dtype),
   then on the root, with ``MixedPrecisionPolicy(param_dtype=compute dtype, reduce_dtype=fp32)``,
   ``reshard_after_forward`` and ``CPUOffloadPolicy`` when
   ``offload_policy`` on an accelerator (on a CPU device there is nothing to offload to, and
   the offload policy would pin memory, which needs an accelerator: it is left off; the config
   check warns once); mesh: 1-D over all ranks, or 2-D (replicate × shard) for HSDP when
   ``0 < fsdp_size < world``.  The root unit (embeddings, final norm, LM head) is never
   resharded after forward (FSDP2's own default for the root: backward starts with the head
   and would all-gather it again at once); the chunked LM-head log-probs
   (:mod:`rlforge.roles.fused_head`) read the head's unsharded weight after the forward.
   :meth:`FSDP2Engine.infer` reshards the root when it is done;
4. explicit prefetch when ``forward_prefetch``: layer ``i`` prefetches layer ``i + 1`` in
   forward and layer ``i - 1`` in backward;
5. the optimizer (AdamW, over the sharded DTensor parameters) and the LR schedule.

Offload.  ``param_offload`` (verl's meaning): the parameters wait on the CPU between phases and
are on the GPU inside each one (:mod:`rlforge.engine.param_offload`).  ``offload_policy``:
FSDP2's ``CPUOffloadPolicy`` keeps the
sharded parameters and gradients in (pinned) CPU memory; each layer's shard is copied to
the GPU for its all-gather, and the optimizer step (hence the optimizer state) runs on
CPU: the cheapest GPU memory, the slowest step.  ``optimizer_offload`` without parameter
offload: the AdamW moments stay on CPU between steps and visit the GPU for the step
(2 × fp32 shard bytes each way per step).  A reference model with ``param_offload`` thus
keeps its weights on CPU between log-prob passes.

Needs a process group (``init_distributed``; ``torchrun --nproc_per_node=1`` for one device).
Every rank must hold identical initial weights (same seed or the same checkpoint).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
    register_fsdp_forward_method,
)
from torch.distributed.tensor import DTensor

from rlforge.batch import Batch
from rlforge.config.common import FSDPConfig
from rlforge.engine.activation import apply_activation_wrappers, decoder_layers
from rlforge.engine.base import ENGINES, ForwardFn
from rlforge.engine.sharded import ShardedEngine, cpu_offload_applies, mixed_precision_dtypes, to_dtype

FORWARD_METHODS = ("forward_with_log_z", "hidden_with_log_z")
"""Methods besides ``forward`` that callers invoke on the root (``PolicyWithLogZ``); FSDP2
must unshard around them too."""


def parallelize_fsdp2(module: nn.Module, fsdp_cfg: FSDPConfig, device: torch.device, mesh: DeviceMesh,
                      checkpointing: bool = False, activation_offload: bool = False) -> nn.Module:
    """Steps 1–4 of the module docstring, in place; returns ``module`` (now an ``FSDPModule``)."""
    module.to(dtype=to_dtype(fsdp_cfg.model_dtype, "fsdp_config.model_dtype"))
    fp32_units = [m for m in module.modules() if getattr(m, "keep_fp32", False)]
    for unit in fp32_units:
        unit.to(dtype=torch.float32)
    apply_activation_wrappers(module, checkpointing, activation_offload)
    offload = cpu_offload_applies(fsdp_cfg, device)
    if not offload:
        module.to(device)
    param_dtype, reduce_dtype, _ = mixed_precision_dtypes(fsdp_cfg, device)
    kw: dict[str, Any] = {
        "mesh": mesh,
        "mp_policy": MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
        "reshard_after_forward": bool(fsdp_cfg.reshard_after_forward),
        "offload_policy": CPUOffloadPolicy() if offload else OffloadPolicy(),
    }
    layers = decoder_layers(module)
    for layer in layers:
        fully_shard(layer, **kw)
    fp32_policy = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)
    for unit in fp32_units:
        fully_shard(unit, **{**kw, "mp_policy": fp32_policy})
    fully_shard(module, **{**kw, "reshard_after_forward": None})  # None: the root keeps its params until backward
    for name in FORWARD_METHODS:
        if callable(getattr(module, name, None)):
            register_fsdp_forward_method(module, name)
    if fsdp_cfg.forward_prefetch:
        for i, layer in enumerate(layers):
            if i + 1 < len(layers):
                layer.set_modules_to_forward_prefetch([layers[i + 1]])
            if i > 0:
                layer.set_modules_to_backward_prefetch([layers[i - 1]])
    return module


@ENGINES.register("fsdp2")
class FSDP2Engine(ShardedEngine):
    """One model sharded with FSDP2, with its optimizer (none for a forward-only model).

    Args:
        module: the UNSHARDED model (on CPU is fine); it is changed in place.
        device: this rank's compute device (``DistInfo.device``).
        fsdp_config: the role's ``fsdp_config`` (None = defaults).
        optim_cfg: the role's ``optim`` config; None = forward-only (reference policy).
        total_steps: LR-schedule length in optimizer steps.
        optim_key: config key of ``optim_cfg`` for error messages.
        grad_clip: max global gradient norm (``<= 0`` disables clipping).
        param_groups: see :data:`~rlforge.engine.sharded.ParamGroupSpec`; None = one group.
        gradient_checkpointing, activation_offload: ``model.enable_gradient_checkpointing`` and
            ``model.enable_activation_offload``.
        mesh: a prebuilt data-parallel mesh; None = :func:`build_mesh` from ``fsdp_size``.
        compile_layers: ``torch.compile`` each decoder layer (``use_torch_compile``).
        share_prompts: see :attr:`~rlforge.engine.base.TrainEngine.share_prompts`.
        trainable_state_only: see :attr:`~rlforge.engine.sharded.ShardedEngine.trainable_state_only`.
    Raises:
        RuntimeError: no process group is initialised.
    """

    strategy = "fsdp2"
    head_readable_after_forward = True  # the root unit is not resharded after forward

    def _shard(self, module: nn.Module, cfg: FSDPConfig, gradient_checkpointing: bool,
               activation_offload: bool) -> nn.Module:
        return parallelize_fsdp2(module, cfg, self.device, self.mesh, gradient_checkpointing, activation_offload)

    @torch.no_grad()
    def infer(self, batch: Batch, forward_fn: ForwardFn, micro_batch_size: int,
              max_token_len: int | None = None) -> dict[str, torch.Tensor]:
        """As :meth:`ShardedEngine.infer`, then the root unit is resharded (without a backward
        nothing else frees its parameters, which the root keeps after forward)."""
        with self.phase():
            try:
                return super().infer(batch, forward_fn, micro_batch_size, max_token_len)
            finally:
                self.module.reshard()

    def _clip_grad_norm(self, max_norm: float) -> float:
        params = [p for p in self.module.parameters() if p.requires_grad and p.grad is not None]
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        return float(norm)

    def full_params_iter(self, device: torch.device | str | None = None,
                         keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """As :meth:`ShardedEngine.full_params_iter`; ``keep(name)`` False skips a tensor without
        gathering it (the same predicate on every rank)."""
        dest = torch.device(device) if device is not None else self.device
        with self.phase():
            for name, t in self.module.state_dict().items():
                if keep is not None and not keep(name):
                    continue
                if isinstance(t, DTensor):
                    if t.device != self.device:  # CPUOffloadPolicy: shards on CPU, gather on the device
                        t = t.to(self.device)
                    t = t.full_tensor()
                yield name, t.detach().to(dest)

"""FSDP1 engine (``strategy=fsdp``): ``FullyShardedDataParallel`` with the same knobs.

Construction order on the UNSHARDED module: master dtype (``model_dtype``) → activation
checkpointing / offload wrappers per decoder layer → ``FullyShardedDataParallel`` with

* auto-wrap: one FSDP unit per (wrapped) decoder layer, or by size when
  ``wrap_policy.min_num_params > 0``;
* ``MixedPrecision(param_dtype, reduce_dtype, buffer_dtype)`` from ``mixed_precision``
  (default: bf16 compute on CUDA, fp32 on CPU; fp32 reduce);
* ``CPUOffload(offload_params=offload_policy)`` (parameters and gradients on CPU; the optimizer
  step runs on CPU; refused under gradient accumulation by the config check);
* ``FULL_SHARD`` (``SHARD_GRAD_OP`` when ``reshard_after_forward=False``), or
  ``HYBRID_SHARD`` (``_HYBRID_SHARD_ZERO2``) on a 2-D mesh when ``0 < fsdp_size < world``;
* ``forward_prefetch``, ``backward_prefetch=BACKWARD_PRE``, ``limit_all_gathers=True``,
  ``use_orig_params=True`` (parameter names survive, so parameter groups work);

then the optimizer and schedule.  ``optimizer_offload`` as in :mod:`rlforge.engine.fsdp2`;
``param_offload`` (verl's meaning: the flat parameters on the CPU between phases) as in
:mod:`rlforge.engine.param_offload`, which accumulates gradients as without offload.
Not supported: :class:`~rlforge.models.log_z.PolicyWithLogZ` (its ``forward_with_log_z``
bypasses FSDP1's root forward); use ``strategy=fsdp2`` for a policy loss with a log Z head.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    FullStateDictConfig,
    FullyShardedDataParallel,
    MixedPrecision,
    ShardingStrategy,
    StateDictType,
)
from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy, size_based_auto_wrap_policy

from rlforge.config.common import FSDPConfig
from rlforge.engine.activation import apply_activation_wrappers, clean_name, decoder_layers
from rlforge.engine.base import ENGINES
from rlforge.engine.fsdp2 import FORWARD_METHODS
from rlforge.engine.param_offload import Mover, fsdp1_mover
from rlforge.engine.sharded import ShardedEngine, cpu_offload_applies, mixed_precision_dtypes, to_dtype


def _strategy(mesh: DeviceMesh, reshard_after_forward: bool) -> ShardingStrategy:
    """verl's choice for ``reshard_after_forward``; NO_SHARD on one rank, where FSDP1 switches to it
    anyway (with a warning every time an engine is built)."""
    if mesh.size() == 1:
        return ShardingStrategy.NO_SHARD
    if mesh.ndim == 2:
        return ShardingStrategy.HYBRID_SHARD if reshard_after_forward else ShardingStrategy._HYBRID_SHARD_ZERO2
    return ShardingStrategy.FULL_SHARD if reshard_after_forward else ShardingStrategy.SHARD_GRAD_OP


def wrap_fsdp1(module: nn.Module, fsdp_cfg: FSDPConfig, device: torch.device, mesh: DeviceMesh,
               checkpointing: bool = False, activation_offload: bool = False) -> FullyShardedDataParallel:
    """The construction order of the module docstring; returns the FSDP root."""
    if any(callable(getattr(module, m, None)) for m in FORWARD_METHODS):
        raise ValueError(f"strategy=fsdp cannot shard {type(module).__name__} (it is called through "
                         f"{FORWARD_METHODS}); use actor_rollout_ref.actor.strategy=fsdp2")
    module.to(dtype=to_dtype(fsdp_cfg.model_dtype, "fsdp_config.model_dtype"))
    apply_activation_wrappers(module, checkpointing, activation_offload)
    layers = set(decoder_layers(module))
    min_params = int(fsdp_cfg.wrap_policy.min_num_params or 0)
    if min_params > 0:
        policy = functools.partial(size_based_auto_wrap_policy, min_num_params=min_params)
    else:
        policy = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: m in layers)
    param_dtype, reduce_dtype, buffer_dtype = mixed_precision_dtypes(fsdp_cfg, device)
    offload = cpu_offload_applies(fsdp_cfg, device)  # off on a CPU device: nothing to offload to
    if not offload:
        module.to(device)
    return FullyShardedDataParallel(
        module,
        device_mesh=mesh,
        sharding_strategy=_strategy(mesh, bool(fsdp_cfg.reshard_after_forward)),
        auto_wrap_policy=policy,
        mixed_precision=MixedPrecision(param_dtype=param_dtype, reduce_dtype=reduce_dtype, buffer_dtype=buffer_dtype),
        cpu_offload=CPUOffload(offload_params=offload),
        device_id=device,
        use_orig_params=True,
        forward_prefetch=bool(fsdp_cfg.forward_prefetch),
        backward_prefetch=BackwardPrefetch.BACKWARD_PRE,
        limit_all_gathers=True,
    )


@ENGINES.register("fsdp")
class FSDP1Engine(ShardedEngine):
    """One model sharded with FSDP1; the arguments are :class:`~rlforge.engine.fsdp2.FSDP2Engine`'s."""

    strategy = "fsdp"
    head_readable_after_forward = False  # the root's original parameters are sharded views again after forward

    def _shard(self, module: nn.Module, cfg: FSDPConfig, gradient_checkpointing: bool,
               activation_offload: bool) -> nn.Module:
        return wrap_fsdp1(module, cfg, self.device, self.mesh, gradient_checkpointing, activation_offload)

    def _clip_grad_norm(self, max_norm: float) -> float:
        return float(self.module.clip_grad_norm_(max_norm))

    def _mover(self) -> Mover:
        return fsdp1_mover(self.module)

    def full_params_iter(self, device: torch.device | str | None = None,
                         keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """FSDP1: the full state dict is gathered unit by unit into CPU memory on every rank
        first (peak: one full CPU copy per rank), then yielded tensor by tensor (those for which
        ``keep(name)`` is true, when given)."""
        dest = torch.device(device) if device is not None else self.device
        cfg = FullStateDictConfig(offload_to_cpu=self.device.type != "cpu", rank0_only=False)  # CPU: segfaults
        with self.phase(), FullyShardedDataParallel.state_dict_type(self.module, StateDictType.FULL_STATE_DICT, cfg):
            full = self.module.state_dict()
        for name, t in full.items():
            if keep is None or keep(clean_name(name)):
                yield clean_name(name), t.to(dest)

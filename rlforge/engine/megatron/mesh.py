"""The mesh of ``strategy=megatron`` and the checks of its sizes against the model (the sizes
themselves: :mod:`rlforge.config.parallel_dims`).

The world of ``W`` processes is laid out as one ``DeviceMesh`` with dimensions
``("pp", "dp", "tp")``, outermost first, as torchtitan's ``ParallelDims`` orders them: the
tensor-parallel ranks of a layer are neighbours (same host, fastest links), data-parallel
replicas come next and pipeline stages are outermost (they exchange only activations).
Global rank ``r = (pp_index * dp + dp_index) * tp + tp_index``.

Besides the three mesh dimensions the engine uses one more group: the *model-parallel* group
(the ``tp * pp`` ranks of one data-parallel index), which together hold one copy of the model
and therefore process the same rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rlforge.config.parallel_dims import ParallelDims
from rlforge.errors import ConfigError


def check_model_fits(dims: ParallelDims, model_config: Any, key: str) -> None:
    """Check that the model splits evenly: attention heads, KV heads and the MLP width over
    ``tp``; decoder layers over ``pp * vpp`` stages.

    Raises:
        ConfigError: naming the ``megatron`` key to change and the model's size.
    """
    tp_key = f"{key}.tensor_model_parallel_size"
    heads = int(model_config.num_attention_heads)
    kv = int(getattr(model_config, "num_key_value_heads", None) or heads)
    inter = int(getattr(model_config, "intermediate_size", 0) or 0)
    for what, n in (("attention heads", heads), ("KV heads", kv), ("MLP width (intermediate_size)", inter)):
        if n and n % dims.tp:
            raise ConfigError(f"{tp_key}={dims.tp} does not divide the model's {n} {what}; "
                              f"choose a tensor-parallel size that divides {n}")
    layers = int(model_config.num_hidden_layers)
    if layers % dims.num_stages:
        what = f"{key}.pipeline_model_parallel_size={dims.pp}"
        if dims.vpp > 1:
            what += f" x {key}.virtual_pipeline_model_parallel_size={dims.vpp}"
        raise ConfigError(f"{what} = {dims.num_stages} stages do not divide the model's {layers} decoder layers; "
                          f"choose sizes whose product divides {layers}")


@dataclass
class ParallelMesh:
    """This rank's place in the ``("pp", "dp", "tp")`` mesh and the groups the engine uses.

    ``mp_ranks``: global ranks of this rank's model-parallel group (same ``dp`` index), sorted;
    ``pp_ranks``: global ranks of this rank's pipeline group, by pipeline index.
    """

    dims: ParallelDims
    mesh: DeviceMesh
    pp_rank: int
    dp_rank: int
    tp_rank: int
    mp_group: Any
    mp_ranks: list[int]
    pp_ranks: list[int]

    @property
    def tp_mesh(self) -> DeviceMesh:
        return self.mesh["tp"]

    @property
    def dp_mesh(self) -> DeviceMesh:
        return self.mesh["dp"]

    @property
    def pp_group(self) -> Any:
        return self.mesh["pp"].get_group()


def global_rank(dims: ParallelDims, pp: int, dp: int, tp: int) -> int:
    """The global rank at mesh coordinate ``(pp, dp, tp)``."""
    return (pp * dims.dp + dp) * dims.tp + tp


def build_parallel_mesh(dims: ParallelDims, device_type: str) -> ParallelMesh:
    """The mesh and groups of ``dims`` (a collective: every rank calls it, in the same order).

    Raises:
        ConfigError: the process group's size differs from ``dims.world``.
    """
    world = dist.get_world_size()
    if world != dims.world:
        raise ConfigError(f"the parallel sizes tp={dims.tp} x pp={dims.pp} x dp={dims.dp} need {dims.world} "
                          f"processes, but {world} were launched")
    mesh = init_device_mesh(device_type, (dims.pp, dims.dp, dims.tp), mesh_dim_names=("pp", "dp", "tp"))
    rank = dist.get_rank()
    tp_rank = rank % dims.tp
    dp_rank = (rank // dims.tp) % dims.dp
    pp_rank = rank // (dims.tp * dims.dp)
    groups = [[global_rank(dims, p, d, t) for p in range(dims.pp) for t in range(dims.tp)] for d in range(dims.dp)]
    if dims.dp == 1:
        mp_group = dist.group.WORLD
    else:
        mp_group, _ = dist.new_subgroups_by_enumeration(groups)
    return ParallelMesh(
        dims=dims, mesh=mesh, pp_rank=pp_rank, dp_rank=dp_rank, tp_rank=tp_rank, mp_group=mp_group,
        mp_ranks=sorted(groups[dp_rank]), pp_ranks=[global_rank(dims, p, dp_rank, tp_rank) for p in range(dims.pp)],
    )

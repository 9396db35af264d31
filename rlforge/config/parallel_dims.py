"""Parallel sizes of ``strategy=megatron`` (verl's ``megatron.*`` keys) and their config-only checks.

Importable without torch, so validation checks the sizes before torch loads; the mesh built from
them is :mod:`rlforge.engine.megatron.mesh`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlforge.errors import ConfigError


@dataclass(frozen=True)
class ParallelDims:
    """Sizes of the parallel dimensions.

    ``tp``: tensor-parallel ranks per layer; ``pp``: pipeline ranks; ``vpp``: model chunks
    (virtual stages) per pipeline rank (1 = no interleaving); ``dp``: data-parallel replicas
    (``world / (tp * pp)``); ``sequence_parallel``: norms and residuals split over the
    sequence between tensor-parallel ranks (only with ``tp > 1``).
    """

    tp: int
    pp: int
    dp: int
    vpp: int = 1
    sequence_parallel: bool = False

    @property
    def num_stages(self) -> int:
        """Pipeline stages in total (``pp * vpp``)."""
        return self.pp * self.vpp

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp


def parallel_dims(cfg: Any, world: int, key: str) -> ParallelDims:
    """The sizes of ``cfg`` (a :class:`~rlforge.config.common.MegatronConfig`) on ``world`` ranks.

    Args:
        cfg: the role's ``megatron`` block.
        world: number of processes.
        key: the block's config key (e.g. ``actor_rollout_ref.actor.megatron``), named in errors.
    Raises:
        ConfigError: a size below 1, ``tp * pp`` not dividing ``world``, or
            ``virtual_pipeline_model_parallel_size > 1`` without pipeline parallelism.
    """
    tp, pp = int(cfg.tensor_model_parallel_size), int(cfg.pipeline_model_parallel_size)
    vpp = int(cfg.virtual_pipeline_model_parallel_size or 1)
    for name, value in (("tensor_model_parallel_size", tp), ("pipeline_model_parallel_size", pp),
                        ("virtual_pipeline_model_parallel_size", vpp)):
        if value < 1:
            raise ConfigError(f"{key}.{name}={value}: must be >= 1")
    if world % (tp * pp):
        raise ConfigError(
            f"{key}.tensor_model_parallel_size={tp} x {key}.pipeline_model_parallel_size={pp} = {tp * pp} does not "
            f"divide the world size {world} (trainer.nnodes x trainer.n_gpus_per_node); choose sizes whose product "
            f"divides {world}"
        )
    if vpp > 1 and pp == 1:
        raise ConfigError(f"{key}.virtual_pipeline_model_parallel_size={vpp} needs "
                          f"{key}.pipeline_model_parallel_size > 1 (interleaving splits pipeline stages)")
    return ParallelDims(tp=tp, pp=pp, dp=world // (tp * pp), vpp=vpp,
                        sequence_parallel=bool(cfg.sequence_parallel) and tp > 1)

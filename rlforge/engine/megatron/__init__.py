"""``strategy=megatron`` (verl's key): tensor, pipeline and data parallelism on PyTorch's own APIs.

Importing this package registers the ``megatron`` engine; see :mod:`rlforge.engine.megatron.engine`.
"""

from rlforge.config.parallel_dims import ParallelDims, parallel_dims
from rlforge.engine.megatron.engine import MegatronEngine
from rlforge.engine.megatron.mesh import check_model_fits

__all__ = ["MegatronEngine", "ParallelDims", "check_model_fits", "parallel_dims"]

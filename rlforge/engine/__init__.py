"""Training engines behind one interface (:class:`TrainEngine`)."""

from rlforge.engine import fsdp1 as _fsdp1  # noqa: F401  (registers "fsdp")
from rlforge.engine import fsdp2 as _fsdp2  # noqa: F401  (registers "fsdp2")
from rlforge.engine import megatron as _megatron  # noqa: F401  (registers "megatron")
from rlforge.engine.base import ENGINES, ForwardFn, LossFn, LossScale, TrainEngine
from rlforge.engine.optim import build_optimizer, build_scheduler

__all__ = [
    "ENGINES", "ForwardFn", "LossFn", "LossScale", "TrainEngine",
    "build_optimizer", "build_scheduler",
]

"""Training engines behind one interface (:class:`TrainEngine`)."""

from rlforge.engine.base import ENGINES, ForwardFn, LossFn, LossScale, TrainEngine
from rlforge.engine.local import LocalEngine
from rlforge.engine.optim import build_optimizer, build_scheduler

__all__ = [
    "ENGINES", "ForwardFn", "LocalEngine", "LossFn", "LossScale", "TrainEngine",
    "build_optimizer", "build_scheduler",
]

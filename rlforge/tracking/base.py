"""What every logger gets and offers.

Every entry of :data:`rlforge.tracking.LOGGERS` is a factory with one signature,
``factory(run: RunInfo) -> Logger``.  Loggers backed by an optional package import it
lazily inside the factory and, when it is missing, raise one :class:`ConfigError` that
names the ``pip install`` command.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Protocol

from rlforge.errors import ConfigError


@dataclass(frozen=True)
class RunInfo:
    """The run a logger records."""

    directory: Path
    """``trainer.default_local_dir``: where file-based loggers write."""
    project: str = "rlforge"
    """``trainer.project_name``."""
    experiment: str = "default"
    """``trainer.experiment_name``."""
    config: dict[str, Any] = field(default_factory=dict)
    """The resolved config as plain containers (recorded by wandb and mlflow); may be empty."""


class Logger(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


PIP_PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "tensorboard"),
    "wandb": ("wandb", "wandb"),
    "mlflow": ("mlflow", "mlflow"),
}
"""``trainer.logger`` name -> (module imported, pip package) for loggers with an optional dependency."""


def require_logger_package(name: str) -> None:
    """Raise :class:`ConfigError` naming the pip package when logger ``name`` needs a module
    that is not installed.  Cheap: it looks the module up without importing it."""
    if name not in PIP_PACKAGES:
        return
    module, pip_name = PIP_PACKAGES[name]
    if find_spec(module) is None:
        raise ConfigError(f"trainer.logger={name} needs the '{pip_name}' package, which is not installed: "
                          f"pip install {pip_name} (or remove '{name}' from trainer.logger)")

"""verl's ``interaction``: a scripted user that answers the model between turns.

An interaction is a class with verl's ``BaseInteraction`` shape, all ``async``:

* ``start_interaction(instance_id=None, **interaction_kwargs) -> str`` (the instance id);
* ``generate_response(instance_id, messages, **kwargs) -> (should_terminate: bool, response: str,
  score: float, metadata: dict)``: ``messages`` is the conversation so far as chat messages
  (``{"role", "content"}``); ``response`` becomes the next user turn unless ``should_terminate``;
* ``calculate_score(instance_id, **kwargs) -> float``;
* ``finalize_interaction(instance_id, **kwargs) -> None``.

``interaction_kwargs`` come from each sample's ``extra_info.interaction_kwargs``; its ``name`` picks
the interaction of the config file (the first one when absent).
"""

from __future__ import annotations

import uuid
from typing import Any


class BaseInteraction:
    """Base class; ``config`` is the entry's ``config`` mapping of the interaction config YAML."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = dict(config or {})
        self.name = str(self.config.get("name", type(self).__name__))
        self._instances: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: str | None = None, **kwargs: Any) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        self._instances[instance_id] = dict(kwargs)
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        raise NotImplementedError

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs: Any) -> None:
        self._instances.pop(instance_id, None)

"""The tool interface, in verl's ``BaseTool`` shape: ``create / execute / calc_reward / release``.

One tool object serves the whole rollout; each sample that may call it gets an *instance*
(``create`` returns its id), so per-sample state (a ground truth, a sandbox) stays apart.  All
four methods are ``async``, as in verl, so a user's verl tool class runs here unchanged when it
imports only the standard library and its own code.

Return shapes (verl's, old and new, both accepted by the agent loop):

* ``create(instance_id=None, **create_kwargs) -> str`` or ``(str, ToolResponse)``;
* ``execute(instance_id, parameters: dict, **execute_kwargs) -> (ToolResponse | str, step_reward: float,
  metrics: dict)``;
* ``calc_reward(instance_id, **calc_reward_kwargs) -> float``;
* ``release(instance_id, **release_kwargs) -> None``.

``create_kwargs`` etc. come from each sample's ``extra_info.tools_kwargs[<tool name>]``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from rlforge.tools.schema import ToolSchema


@dataclass
class ToolResponse:
    """What a tool call returns to the model (verl's ``ToolResponse``; only text is used here)."""

    text: str | None = None


class ToolError(Exception):
    """Raised by a tool for a bad call (wrong arguments): its message becomes the tool response."""


class BaseTool:
    """A tool the model can call; subclass it and register it with :data:`rlforge.tools.TOOLS`.

    Args:
        config: the ``config`` mapping of the tool's entry in the tool config YAML.
        tool_schema: the parsed ``tool_schema`` (:class:`ToolSchema`).
    """

    def __init__(self, config: dict[str, Any], tool_schema: ToolSchema) -> None:
        self.config = dict(config or {})
        self.tool_schema = tool_schema
        self.name = tool_schema.name
        self._instances: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> ToolSchema:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        """Start one sample's instance; returns its id (a new UUID when None) and an empty response."""
        instance_id = instance_id or str(uuid.uuid4())
        self._instances[instance_id] = dict(kwargs)
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        """Run one call with the model's ``parameters``; returns ``(response, step_reward, metrics)``."""
        raise NotImplementedError

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The instance's reward at the end of the conversation (0.0 by default)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Free the instance's state."""
        self._instances.pop(instance_id, None)

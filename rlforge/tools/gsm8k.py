"""``gsm8k``: the model submits an answer and reads its score, in the manner of verl's ``Gsm8kTool``.

Each sample's instance is created with ``create_kwargs: {ground_truth: "72"}`` (from the row's
``extra_info.tools_kwargs``, or the row's ``reward_model.ground_truth``, which the agent loop passes).
``execute({"answer": "72"})`` scores the answer with rlforge's GSM8K rule (flexible extraction; the
answer is prefixed with ``#### `` when it lacks it), keeps the best score so far and returns it as
text; the step reward is -0.05 when the answer did not improve on the last one (verl's penalty for
repeating).  ``calc_reward`` returns the instance's last score (0.0 or 1.0).
"""

from __future__ import annotations

from typing import Any

from rlforge.rewards.gsm8k import compute_score
from rlforge.tools.base import BaseTool, ToolResponse
from rlforge.tools.registry import TOOLS


@TOOLS.register("gsm8k", "verl.tools.gsm8k_tool.Gsm8kTool", "rlforge.tools.gsm8k.Gsm8kTool")
class Gsm8kTool(BaseTool):
    """Answer-checking tool; the schema's argument is ``answer`` (a string)."""

    async def create(self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        iid, resp = await super().create(instance_id)
        self._instances[iid] = {"ground_truth": "" if ground_truth is None else str(ground_truth), "reward": 0.0}
        return iid, resp

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        state = self._instances.setdefault(instance_id, {"ground_truth": "", "reward": 0.0})
        answer = str(parameters.get("answer", ""))
        if not answer.startswith("#### "):
            answer = "#### " + answer
        reward = compute_score(answer, state["ground_truth"], method="flexible")
        penalty = 0.0 if reward > state["reward"] else -0.05
        state["reward"] = reward
        return ToolResponse(f"Current parsed answer={answer[5:]!r} reward={reward}"), penalty, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return float(self._instances.get(instance_id, {}).get("reward", 0.0))

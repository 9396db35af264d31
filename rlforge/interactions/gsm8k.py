"""The built-in ``gsm8k`` interaction (verl's ``Gsm8kInteraction`` behaviour).

After each model turn it scores the last assistant message against the instance's
``ground_truth`` with rlforge's GSM8K rule (flexible extraction, ``#### `` prefixed when missing).
A correct answer ends the conversation (``should_terminate=True``, score 1.0); otherwise the user
turn is ``config.retry_message`` (default: "Your response is incorrect! You need to reflect on
your answer and try again.") and the conversation goes on, up to ``multi_turn.max_user_turns``.
"""

from __future__ import annotations

from typing import Any

from rlforge.interactions.base import BaseInteraction
from rlforge.interactions.registry import INTERACTIONS
from rlforge.rewards.gsm8k import compute_score

RETRY = "Your response is incorrect! You need to reflect on your answer and try again."


@INTERACTIONS.register("gsm8k", "verl.interactions.gsm8k_interaction.Gsm8kInteraction")
class Gsm8kInteraction(BaseInteraction):
    """Scores the last assistant turn; ``interaction_kwargs``: ``ground_truth``."""

    async def start_interaction(self, instance_id: str | None = None, ground_truth: Any = None, **kwargs: Any) -> str:
        iid = await super().start_interaction(instance_id)
        self._instances[iid] = {"ground_truth": "" if ground_truth is None else str(ground_truth), "reward": 0.0}
        return iid

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        text = last if "#### " in last else "#### " + last
        state = self._instances.setdefault(instance_id, {"ground_truth": "", "reward": 0.0})
        state["reward"] = compute_score(text, state["ground_truth"], method="flexible")
        if state["reward"] == 1.0:
            return True, "Your response is correct!", 1.0, {}
        return False, str(self.config.get("retry_message", RETRY)), 0.0, {}

    async def calculate_score(self, instance_id: str, **kwargs: Any) -> float:
        return float(self._instances.get(instance_id, {}).get("reward", 0.0))

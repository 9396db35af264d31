"""One sample's conversation state in the agent loop, and what happens at the end of a model turn.

The model's turn ends at EOS (or when the response budget runs out).  :meth:`Conversation.end_turn`
decides, on the main thread, what comes next: stop, run the turn's tool calls, or ask the
interaction for a user reply.  The tool calls / interaction run on a worker thread
(:meth:`Conversation.next_messages`); the main thread then renders the returned messages into
inserted ids and appends them to the same sequence (the engine keeps its KV cache).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from rlforge.rollout.multi_turn.config import MultiTurnConfig
from rlforge.rollout.multi_turn.executor import CallResult, SampleTools, _in_thread
from rlforge.rollout.multi_turn.parser import clean_text, parse_hermes

STOP_REASONS = ("eos", "length", "max_assistant_turns", "max_user_turns", "interaction", "truncated_at_turn")
"""Why a conversation ended: the model stopped calling tools (``eos``); the response budget ran out inside a
model turn (``length``); a turn limit; the interaction ended it; or the next inserted turn would not fit
``data.max_response_length`` (``truncated_at_turn``: cut at the turn boundary)."""


@dataclass
class Conversation:
    """State of row ``row``.  ``mask[i]`` is 1 when output token ``i`` was sampled, 0 when inserted."""

    row: int
    cfg: MultiTurnConfig
    tools: SampleTools | None
    interaction: Any | None = None
    interaction_kwargs: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    turn_start: int = 0
    assistant_turns: int = 0
    user_turns: int = 0
    stop_reason: str = ""
    calls: list[CallResult] = field(default_factory=list)
    interaction_id: str | None = None
    interaction_score: float = 0.0
    tool_reward: float = 0.0
    user_turn_rewards: list[float] = field(default_factory=list)
    _last_turn: bool = False

    @property
    def truncated(self) -> bool:
        return self.stop_reason in ("length", "truncated_at_turn")

    @property
    def num_turns(self) -> int:
        """verl's count: the prompt, every model turn and every inserted turn."""
        return 1 + self.assistant_turns + self.user_turns

    def end_turn(self, text: str, hit_length: bool) -> list[Any] | None:
        """Record the model turn ``text``; returns the parsed tool calls to run, ``[]`` to ask the
        interaction, or None when the conversation is over (``stop_reason`` set)."""
        self.assistant_turns += 1
        text = clean_text(text)
        self.messages.append({"role": "assistant", "content": text})
        if hit_length:
            self.stop_reason = "length"
            return None
        calls = parse_hermes(text) if self.tools is not None and self.tools.tools else []
        if not calls and self.interaction is None:
            self.stop_reason = "eos"
            return None
        mat, mut = self.cfg.max_assistant_turns, self.cfg.max_user_turns
        if mat is not None and self.assistant_turns >= mat:
            self.stop_reason = "max_assistant_turns"
            return None
        if mut is not None and self.user_turns >= mut:
            if calls:  # tool output that could not be inserted is not worth running
                self.stop_reason = "max_user_turns"
                return None
            self._last_turn = True  # the interaction still scores this turn; its reply is not inserted
        return calls

    def next_messages(self, calls: list[Any]) -> list[dict[str, Any]] | None:
        """Worker thread: run ``calls`` (or the interaction when empty); the messages to insert, or
        None when the interaction ends the conversation."""
        if calls:
            assert self.tools is not None
            t0 = time.monotonic()
            started = self.tools.start(calls, self.cfg.max_parallel_calls)
            results = self.tools.finish(started, calls, self.cfg.tool_timeout_s, self.cfg.max_tool_response_length,
                                        self.cfg.tool_response_truncate_side, t0)
            self.calls.extend(results)
            return [{"role": "tool", "content": r.text} for r in results]
        it = self.interaction
        try:
            if self.interaction_id is None:
                self.interaction_id = _in_thread(lambda: it.start_interaction(None, **self.interaction_kwargs)).result(
                    timeout=self.cfg.tool_timeout_s)
            done, reply, score, _ = _in_thread(lambda: it.generate_response(
                self.interaction_id, list(self.messages), **self.interaction_kwargs)).result(timeout=self.cfg.tool_timeout_s)
        except Exception as e:  # noqa: BLE001 - an interaction failure ends this conversation only
            self.stop_reason = f"interaction_error: {type(e).__name__}: {e}"[:200]
            return None
        self.interaction_score = float(score or 0.0)
        self.user_turn_rewards.append(self.interaction_score)
        if done:
            self.stop_reason = "interaction"
            return None
        if self._last_turn:
            self.stop_reason = "max_user_turns"
            return None
        return [{"role": "user", "content": clean_text(reply if isinstance(reply, bytes) else str(reply))}]

    @property
    def reward_scores(self) -> dict[str, Any]:
        """verl's per-sample ``reward_scores``: ``{tool name: its calc_reward value}`` for every tool this
        sample called, plus ``user_turn_rewards`` (the interaction's score of each of its turns) when the
        sample had an interaction.  The reward function reads it as ``extra_info["rollout_reward_scores"]``."""
        out: dict[str, Any] = dict(self.tools.reward_scores) if self.tools is not None else {}
        if self.interaction is not None:
            out["user_turn_rewards"] = list(self.user_turn_rewards)
        return out

    def close(self) -> None:
        """Worker thread: tools' ``calc_reward`` + ``release``, the interaction's ``finalize_interaction``."""
        if self.tools is not None:
            self.tool_reward = self.tools.step_reward + self.tools.close(self.cfg.tool_timeout_s)
        if self.interaction is not None and self.interaction_id is not None:
            try:
                _in_thread(lambda: self.interaction.finalize_interaction(self.interaction_id)).result(
                    timeout=self.cfg.tool_timeout_s)
            except Exception:  # noqa: BLE001
                pass


def run_sync(coro: Any) -> Any:
    """Run one coroutine to completion on a fresh event loop (for tests and callers off the loop)."""
    return asyncio.run(coro)

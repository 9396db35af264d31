"""``actor_rollout_ref.rollout.multi_turn.*``: verl's multi-turn keys, checked into a typed config.

The schema types ``multi_turn`` (:class:`rlforge.config.rollout.MultiTurnSchema`: keys and types, checked
when the config loads); :meth:`MultiTurnConfig.from_mapping` is the one place its values are read and
checked (ranges, formats).  A mapping with an unknown sub-key is an error naming the closest valid one.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

from rlforge.errors import ConfigError

KEY = "actor_rollout_ref.rollout.multi_turn"


@dataclass(frozen=True)
class MultiTurnConfig:
    """Multi-turn rollout settings (verl's names and defaults, plus ``tool_timeout_s``)."""

    enable: bool = False
    """Run the agent loop (tools, interactions) instead of one response per prompt."""
    max_assistant_turns: int | None = None
    """Model turns per conversation; None = until the model stops calling tools or the length runs out."""
    max_user_turns: int | None = None
    """Inserted turns (tool responses and interaction replies) per conversation; None = no limit."""
    max_parallel_calls: int = 1
    """Tool calls run from one model turn (they run concurrently); later calls of configured tools get an error
    response.  A call that does not parse or names an unknown tool gets its own error and takes no slot."""
    max_tool_response_length: int = 256
    """Characters of one tool response the model reads (verl counts characters, not tokens)."""
    tool_response_truncate_side: str = "middle"
    """Which part of a long tool response is kept: ``left`` (the start) | ``right`` (the end) | ``middle`` (both ends)."""
    tool_config_path: str | None = None
    """verl's tool config YAML (``tools: [{class_name, config, tool_schema}]``); None = no tools."""
    interaction_config_path: str | None = None
    """verl's interaction config YAML (``interaction: [{name, class_name, config}]``); None = no interaction."""
    format: str = "hermes"
    """Tool-call format the model writes: ``hermes`` (``<tool_call>{json}</tool_call>``, Qwen2.5/3, Hermes)."""
    tool_timeout_s: float = 30.0
    """rlforge: wall seconds one tool call (create + execute) may take before it counts as a timeout."""
    use_inference_chat_template: bool = False
    """verl: accepted; token-in/token-out means turns are never re-rendered, so it has no effect."""
    tokenization_sanity_check_mode: str = "strict"
    """verl: accepted; nothing is re-tokenized here, so there is nothing to check."""
    num_repeat_rollouts: int | None = None
    """verl: accepted (warned by :mod:`rlforge.config.later_work`); ``rollout.n`` gives the responses per prompt."""
    max_tokens_per_turn: int | None = None
    """Model tokens per assistant turn; a turn that reaches it ends there (an EOS is inserted, masked 0) and
    the conversation goes on.  None = a turn runs until EOS or ``data.max_response_length``."""

    @classmethod
    def from_mapping(cls, raw: Any) -> MultiTurnConfig:
        """Build from the ``multi_turn`` block: the schema's dataclass or a mapping (None = defaults).

        Raises:
            ConfigError: an unknown sub-key (naming the closest), a value of the wrong type, a
                count < 1, ``max_tool_response_length`` < 1, ``tool_timeout_s`` <= 0, or an unknown
                ``format`` / ``tool_response_truncate_side``.
        """
        if dataclasses.is_dataclass(raw) and not isinstance(raw, type):
            raw = {f.name: getattr(raw, f.name) for f in dataclasses.fields(raw)}
        raw = dict(raw or {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kw: dict[str, Any] = {}
        for k, v in raw.items():
            if k not in fields:
                close = difflib.get_close_matches(k, fields, n=1)
                hint = f"; did you mean {KEY}.{close[0]}?" if close else f"; valid: {', '.join(fields)}"
                raise ConfigError(f"{KEY}.{k}: unknown key{hint}")
            kw[k] = v
        for k in ("max_assistant_turns", "max_user_turns", "max_parallel_calls", "max_tool_response_length",
                  "max_tokens_per_turn"):
            v = kw.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{KEY}.{k}={v!r}: must be an integer >= 1" + (" or null" if k != "max_parallel_calls"
                                                                                   and k != "max_tool_response_length" else ""))
        if not isinstance(kw.get("enable", False), bool):
            raise ConfigError(f"{KEY}.enable={kw['enable']!r}: must be true or false")
        t = kw.get("tool_timeout_s", 30.0)
        if isinstance(t, bool) or not isinstance(t, int | float) or t <= 0:
            raise ConfigError(f"{KEY}.tool_timeout_s={t!r}: must be a number of seconds > 0")
        if kw.get("format", "hermes") != "hermes":
            raise ConfigError(f"{KEY}.format={kw['format']!r}: only 'hermes' (<tool_call>{{json}}</tool_call>) is "
                              "available")
        if kw.get("tool_response_truncate_side", "middle") not in ("left", "right", "middle"):
            raise ConfigError(f"{KEY}.tool_response_truncate_side={kw['tool_response_truncate_side']!r}: must be "
                              "left, right or middle")
        for k in ("tool_config_path", "interaction_config_path"):
            if kw.get(k) is not None and not isinstance(kw[k], str):
                raise ConfigError(f"{KEY}.{k}={kw[k]!r}: must be a file path or null")
        return cls(**kw)

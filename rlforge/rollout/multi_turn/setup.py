"""Wiring: check the ``multi_turn`` keys before any model loads, and turn the native rollout into the agent loop."""

from __future__ import annotations

from typing import Any

from rlforge.errors import ConfigError
from rlforge.rollout.multi_turn.config import KEY, MultiTurnConfig


def check_multi_turn(cfg: Any) -> MultiTurnConfig:
    """Parse ``actor_rollout_ref.rollout.multi_turn`` and, when enabled, load its tool and interaction files
    (so that a bad ``class_name`` or schema stops the run here, before any model loads).

    Raises:
        ConfigError: see :meth:`MultiTurnConfig.from_mapping`, :func:`rlforge.tools.load_tools` and
            :func:`rlforge.interactions.load_interactions`; and ``rollout.name=hf`` with ``enable=true``.
    """
    r = cfg.actor_rollout_ref.rollout
    mt = MultiTurnConfig.from_mapping(r.multi_turn)
    if not mt.enable:
        return mt
    if r.name == "hf":
        raise ConfigError(f"{KEY}.enable=true runs on the native engine only; set actor_rollout_ref.rollout.name=native "
                          "(the hf rollout has no multi-turn loop)")
    load_components(mt)
    return mt


def load_components(mt: MultiTurnConfig) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(tools, interactions)`` from ``tool_config_path`` / ``interaction_config_path`` (empty when unset)."""
    from rlforge.interactions import load_interactions
    from rlforge.tools import load_tools

    tools = load_tools(mt.tool_config_path) if mt.tool_config_path else {}
    interactions = load_interactions(mt.interaction_config_path) if mt.interaction_config_path else {}
    return tools, interactions


def prompt_tool_schemas(cfg: Any) -> list[dict[str, Any]] | None:
    """The OpenAI function schemas of ``multi_turn.tool_config_path``'s tools, for the chat template's
    ``tools=`` argument when the prompts are rendered (:class:`rlforge.data.RLDataset`), as verl's agent
    loop renders them; None when ``multi_turn.enable`` is false or no tool config is set.

    Raises:
        ConfigError: see :func:`rlforge.tools.load_tools`.
    """
    mt = MultiTurnConfig.from_mapping(cfg.actor_rollout_ref.rollout.multi_turn)
    if not mt.enable or not mt.tool_config_path:
        return None
    tools, _ = load_components(mt)
    return [t.tool_schema.to_openai() for t in tools.values()] or None


def maybe_multi_turn(rollout: Any, cfg: Any, tokenizer: Any) -> Any:
    """``rollout`` itself when ``multi_turn.enable`` is false, else a
    :class:`~rlforge.rollout.multi_turn.native.MultiTurnNativeRollout` with the same settings.

    Raises:
        ConfigError: ``enable=true`` and ``rollout`` is not the native engine (``rollout.name`` resolved to
            ``hf``, e.g. ``vllm`` on a model the native runner does not reproduce).
    """
    from rlforge.rollout.multi_turn.native import MultiTurnNativeRollout
    from rlforge.rollout.native import NativeRollout

    mt = MultiTurnConfig.from_mapping(cfg.actor_rollout_ref.rollout.multi_turn)
    if not mt.enable:
        return rollout
    if not isinstance(rollout, NativeRollout):
        raise ConfigError(f"{KEY}.enable=true runs on the native engine only, and this model/rollout.name "
                          f"({cfg.actor_rollout_ref.rollout.name}) uses {type(rollout).__name__}; set "
                          "actor_rollout_ref.rollout.name=native with a Llama/Qwen-family model")
    tools, interactions = load_components(mt)
    return MultiTurnNativeRollout.from_native(rollout, tokenizer=tokenizer, multi_turn=mt, tools=tools,
                                              interactions=interactions)

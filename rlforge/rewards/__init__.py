"""Rewards: rule scorers by data_source, custom reward functions, the reward manager.

Public API:
    RewardManager(tokenizer, custom_path=None, custom_name='compute_score', reward_fn_key='data_source')
        .score(batch) -> RewardOutput(token_level_scores, scores, extra, extra_text, decoded)
    build_reward_manager(cfg, tokenizer) -> RewardManager
    default_compute_score(data_source, solution_str, ground_truth, extra_info) -> float
    REWARD_RULES: Registry of rules by data_source ('openai/gsm8k', 'rlforge/arithmetic')
    load_custom_reward_function(path, name) -> callable

Model scores (imported from their modules, so that the core stays light):
    rlforge.rewards.model_reward.with_model_reward(manager, cfg, device, seed, dtype) -> the manager, wrapped
        when reward_model.enable or reward_model.judge.enable; reward_metrics(reward) -> dict
    rlforge.rewards.reward_model.SequenceRewardModel / load_sequence_rm (discriminative reward model)
    rlforge.rewards.judge.LLMJudge / ScoreParser / engine_generate (LLM judge)
"""

from rlforge.rewards.custom import call_reward_fn, load_custom_reward_function
from rlforge.rewards.manager import (
    REWARD_MANAGERS,
    RewardManager,
    RewardOutput,
    build_reward_manager,
    last_valid_index,
)
from rlforge.rewards.rules import REWARD_RULES, RewardFn, default_compute_score

__all__ = [
    "REWARD_MANAGERS",
    "REWARD_RULES",
    "RewardFn",
    "RewardManager",
    "RewardOutput",
    "build_reward_manager",
    "call_reward_fn",
    "default_compute_score",
    "last_valid_index",
    "load_custom_reward_function",
]

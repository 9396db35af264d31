"""Rewards: rule scorers by data_source, custom reward functions, the reward managers.

Public API:
    REWARD_MANAGERS: Registry of verl's managers (reward_model.reward_manager): naive, batch, prime, dapo
    RewardManager(tokenizer, custom_path=None, custom_name='compute_score', reward_fn_key='data_source',
                  overlong=None, reward_kwargs=None, timeout_s=None, failure_score=0.0, num_workers=1)
        .score(batch) -> RewardOutput(token_level_scores, scores, extra, extra_text, decoded, metrics)
    build_reward_manager(cfg, tokenizer) -> RewardManager
    ScorerPool(fn, num_workers, timeout_s): forked scorer processes with a per-task timeout
    default_compute_score(data_source, solution_str, ground_truth, extra_info) -> float
    REWARD_RULES: Registry of rules by data_source ('openai/gsm8k', 'rlforge/arithmetic')
    extract_answer(data_source, solution_str) -> str | None: the rule's answer (validation's maj@N)
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
    last_valid_index,
)
from rlforge.rewards.managers import (
    BatchRewardManager,
    DAPORewardManager,
    PrimeRewardManager,
    build_reward_manager,
)
from rlforge.rewards.pool import ScorerPool
from rlforge.rewards.rules import REWARD_RULES, RewardFn, default_compute_score, extract_answer

__all__ = [
    "REWARD_MANAGERS",
    "REWARD_RULES",
    "BatchRewardManager",
    "DAPORewardManager",
    "PrimeRewardManager",
    "RewardFn",
    "RewardManager",
    "RewardOutput",
    "ScorerPool",
    "build_reward_manager",
    "call_reward_fn",
    "default_compute_score",
    "extract_answer",
    "last_valid_index",
    "load_custom_reward_function",
]

"""``reward_model.*`` and ``custom_reward_function.*`` (verl key names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from rlforge.config.common import FSDPConfig


@dataclass
class RewardModelModelConfig:
    """The reward model network (``reward_model.model``)."""

    input_tokenizer: str | None = II("actor_rollout_ref.model.path")
    """Tokenizer of the policy, used to decode responses before re-tokenizing for the RM; None = same as RM."""
    path: str = "~/models/FsfairX-LLaMA3-RM-v0.1"
    """Reward model location (verl's default)."""
    external_lib: str | None = II("actor_rollout_ref.model.external_lib")
    """Module imported before loading; defaults to the actor's."""
    trust_remote_code: bool = False
    """Allow model code from the repository to run."""
    use_shm: bool = False
    """Accepted; no effect."""
    use_remove_padding: bool = False
    """Pack sequences without padding."""
    use_fused_kernels: bool = II("actor_rollout_ref.model.use_fused_kernels")
    """Defaults to the actor's."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP settings."""


@dataclass
class OverlongBufferConfig:
    """DAPO soft over-long penalty."""

    enable: bool = False
    """Penalise responses entering the last ``len`` tokens of ``max_response_length``."""
    len: int = 0
    """Buffer length (tokens)."""
    penalty_factor: float = 0.0
    """Penalty at the very end of the buffer (reward units; grows linearly through it)."""
    log: bool = False
    """Log the penalty as a metric."""


@dataclass
class RewardModelConfig:
    """Model-based reward and the reward manager."""

    enable: bool = False
    """Score with a reward model (False = rule/custom function only)."""
    strategy: str = "fsdp"
    """Engine: ``fsdp`` | ``fsdp2`` | ``megatron``."""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    """Reward model network."""
    micro_batch_size: int | None = None
    """Deprecated global micro batch; None = unset."""
    micro_batch_size_per_gpu: int | None = None
    """Sequences per reward-model forward; None = whole batch."""
    max_length: int | None = None
    """Maximum RM input length (tokens); None = prompt + response length."""
    use_dynamic_bsz: bool = II("critic.use_dynamic_bsz")
    """Defaults to ``critic.use_dynamic_bsz``."""
    forward_max_token_len_per_gpu: int = II("critic.forward_max_token_len_per_gpu")
    """Defaults to ``critic.forward_max_token_len_per_gpu`` (tokens)."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence-parallel degree; 1 = off."""
    reward_manager: str = "naive"
    """Reward-manager registry name (verl's): ``naive`` (one sample at a time) | ``batch`` (the function
    takes lists) | ``prime`` (a pool of ``num_workers`` processes) | ``dapo`` (naive + ``acc``)."""
    timeout_s: float | None = None
    """rlforge's own key: per-sample scoring limit in seconds (``batch``: for the one call on the whole
    batch).  With a limit, scoring runs in worker processes that are killed and replaced on a timeout;
    the sample gets ``failure_score`` and counts in ``reward/timeouts``.  None = no limit (``naive``,
    ``batch``, ``dapo`` then score in the trainer's process)."""
    failure_score: float = 0.0
    """rlforge's own key: the score (reward units) of a sample whose scorer timed out, raised, returned a
    non-number or killed its worker; counted in ``reward/timeouts`` / ``reward/errors`` with a warning.
    A batch in which EVERY sample fails with an error stops the run instead."""
    num_workers: int = 0
    """rlforge's own key: processes of the ``prime`` pool (per rank); 0 = the CPU count, at most 16."""
    launch_reward_fn_async: bool = False
    """Compute rule rewards in a background worker overlapping the log-prob passes."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Free-form keyword arguments for the reward manager."""
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    """DAPO over-long penalty."""
    sandbox_fusion: dict[str, Any] = field(default_factory=dict)
    """Free-form code-sandbox settings (``url``, ``max_concurrent``, ``memory_limit_mb``)."""
    profiler: dict[str, Any] = field(default_factory=dict)
    """Free-form profiler settings."""


@dataclass
class CustomRewardFunctionConfig:
    """A user reward function loaded from a file."""

    path: str | None = None
    """Python file defining the function; None = rlforge's built-in scorers by ``data.reward_fn_key``."""
    name: str = "compute_score"
    """Function name inside ``path``."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Free-form extra keyword arguments passed to the function (with ``path`` only)."""

"""``reward_model.*`` and ``custom_reward_function.*`` (verl key names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from rlforge.config.common import FSDPConfig
from rlforge.config.profiler import FollowerProfilerConfig, follower_profiler


@dataclass
class RewardModelModelConfig:
    """The reward model network (``reward_model.model``)."""

    input_tokenizer: str | None = II("actor_rollout_ref.model.path")
    """Tokenizer of the policy, used to decode responses before re-tokenizing for the RM (rlforge decodes with
    ``actor_rollout_ref.model``'s tokenizer, so only null matters); None = the RM shares the policy's tokenizer
    and reads the policy's prompt + response ids as they are (no chat-template switch)."""
    path: str = "~/models/FsfairX-LLaMA3-RM-v0.1"
    """Reward model location: a local folder or a Hub id ``org/name`` (verl's default)."""
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


DEFAULT_JUDGE_TEMPLATE = (
    "You are grading an answer to a question.\n\nQuestion:\n{prompt}\n\nReference answer:\n{ground_truth}\n\n"
    "Answer to grade:\n{response}\n\nRate the answer from 0 (wrong) to 10 (fully correct). "
    "Reply with one line: Score: <number>"
)
"""The default ``reward_model.judge.prompt_template``."""


@dataclass
class RewardJudgeConfig:
    """A generative reward model ("LLM judge", ``reward_model.judge``; rlforge keys: verl has no judge
    keys, it scores with a generative RM through a custom reward function).

    The judge generates a judgment for every response; the number parsed from it is the sample's
    model score, combined with the rule score by ``reward_model.combine``.
    """

    enable: bool = False
    """Score responses with the judge (:mod:`rlforge.rewards.judge`)."""
    path: str | None = None
    """Judge model: a local Hugging Face causal-LM folder, a Hub id ``org/name``, a ``.gguf`` file or
    ``preset:NAME``; required when ``enable``."""
    tokenizer_path: str | None = None
    """Judge tokenizer; None = the judge folder's own (presets: the default model's)."""
    prompt_template: str = DEFAULT_JUDGE_TEMPLATE
    """Judge prompt; ``{prompt}`` (the policy's prompt as text), ``{response}`` (required) and ``{ground_truth}``
    are replaced, any other text (braces included) is kept as written."""
    apply_chat_template: bool = True
    """Wrap the filled template as one user message in the judge tokenizer's chat template."""
    score_regex: str | None = None
    """A regular expression with exactly one group holding the score (its LAST match in the judgment counts);
    None = the last number in the judgment that lies in ``score_range``."""
    score_range: list[float] = field(default_factory=lambda: [0.0, 10.0])
    """``[lo, hi]``: a parsed score outside it counts as a parse failure (both parsers)."""
    failure_score: float = 0.0
    """Score of a judgment that has no parsable score (reward units); counted in ``reward/judge_parse_failures``."""
    response_length: int = 64
    """Most tokens the judge generates per judgment."""
    temperature: float = 0.0
    """Judge sampling temperature; 0 = greedy."""


@dataclass
class SandboxFusionConfig:
    """verl's ``reward_model.sandbox_fusion``: a remote code sandbox for verl's code reward (not used here:
    rlforge's python tool takes its own ``sandbox_fusion_url``)."""

    url: str | None = None
    """Sandbox endpoint; null = none."""
    max_concurrent: int = 64
    """Concurrent sandbox requests."""
    memory_limit_mb: int = 1024
    """Memory limit of one run (MiB)."""


@dataclass
class RewardModelConfig:
    """Model-based reward and the reward manager."""

    enable: bool = False
    """Score with a discriminative reward model (``AutoModelForSequenceClassification``, one label, read at the
    last non-pad token; :mod:`rlforge.rewards.reward_model`).  As in verl, its score REPLACES the rule /
    custom-function score (``combine=override``); ``combine=sum`` adds them."""
    strategy: str = "fsdp"
    """Engine: ``fsdp`` | ``fsdp2`` | ``megatron``.  The reward model runs forward-only as one plain module per
    process, whatever this says (a warning says so when it is not the default)."""
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    """Reward model network."""
    micro_batch_size: int | None = None
    """Deprecated global micro batch (sequences); used when ``micro_batch_size_per_gpu`` is None; None = unset."""
    micro_batch_size_per_gpu: int | None = None
    """Sequences per reward-model forward; None = the whole batch in one forward."""
    max_length: int | None = None
    """Most tokens of one reward-model (or judge) input, after its chat template; None = no limit.  A longer
    input is an error naming this key (never cut silently)."""
    use_dynamic_bsz: bool = II("critic.use_dynamic_bsz")
    """Micro-batches by a token budget (``forward_max_token_len_per_gpu``) instead of a sequence count;
    defaults to ``critic.use_dynamic_bsz``."""
    forward_max_token_len_per_gpu: int = II("critic.forward_max_token_len_per_gpu")
    """Token budget of one reward-model forward with ``use_dynamic_bsz`` (tokens, padding included); defaults
    to ``critic.forward_max_token_len_per_gpu``."""
    combine: str = "override"
    """How a model score (reward model or judge) meets the rule / custom-function score: ``override`` (verl:
    the model score replaces it) | ``sum`` (rule score + model score).  rlforge key."""
    judge: RewardJudgeConfig = field(default_factory=RewardJudgeConfig)
    """Generative reward model / LLM judge (rlforge keys)."""
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
    sandbox_fusion: SandboxFusionConfig = field(default_factory=SandboxFusionConfig)
    """verl's code-sandbox reward settings (not used: warned)."""
    profiler: FollowerProfilerConfig = field(default_factory=lambda: follower_profiler(reward_model=True))
    """verl's per-role profiler (:mod:`rlforge.config.profiler`); rlforge profiles whole steps."""


@dataclass
class CustomRewardFunctionConfig:
    """A user reward function loaded from a file."""

    path: str | None = None
    """Python file defining the function; None = rlforge's built-in scorers by ``data.reward_fn_key``."""
    name: str = "compute_score"
    """Function name inside ``path``."""
    reward_kwargs: dict[str, Any] = field(default_factory=dict)
    """Free-form extra keyword arguments passed to the function (with ``path`` only)."""


def check_model_reward(cfg: Any) -> None:
    """Validation of the model-score keys (called by ``validate_config``).

    Raises:
        ConfigError: ``reward_model.combine`` not ``override``/``sum``; both ``reward_model.enable`` and
            ``reward_model.judge.enable``; a judge without ``path``; a judge template without ``{response}``;
            a bad ``score_regex`` or ``score_range``; a non-positive ``max_length`` / micro-batch size.
    """
    from rlforge.errors import ConfigError

    rm = cfg.reward_model
    if rm.combine not in ("override", "sum"):
        raise ConfigError(f"reward_model.combine={rm.combine!r}: expected override (verl: the model score replaces "
                          "the rule score) or sum")
    for key in ("max_length", "micro_batch_size_per_gpu", "micro_batch_size"):
        v = getattr(rm, key)
        if v is not None and int(v) < 1:
            raise ConfigError(f"reward_model.{key}={v}: must be >= 1 or null")
    j = rm.judge
    if not j.enable:
        return
    if rm.enable:
        raise ConfigError("reward_model.enable=true and reward_model.judge.enable=true: choose one model score "
                          "(a reward model or a judge)")
    if not j.path:
        raise ConfigError("reward_model.judge.enable=true needs reward_model.judge.path (a local causal-LM folder, "
                          "a Hub id org/name or preset:NAME)")
    from rlforge.rewards.judge import ScoreParser, check_template

    check_template(j.prompt_template)
    if len(j.score_range) != 2:
        raise ConfigError(f"reward_model.judge.score_range={list(j.score_range)}: give two numbers [lo, hi]")
    ScoreParser(j.score_regex, float(j.score_range[0]), float(j.score_range[1]))
    if int(j.response_length) < 1:
        raise ConfigError(f"reward_model.judge.response_length={j.response_length}: must be >= 1")
    if float(j.temperature) < 0:
        raise ConfigError(f"reward_model.judge.temperature={j.temperature}: must be >= 0 (0 = greedy)")

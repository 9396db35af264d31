"""``actor_rollout_ref.rollout.*``: generation settings (verl key names and defaults).

This build generates in the training process with rlforge's ``native`` engine (or transformers'
``generate``, ``hf``); vLLM/SGLang keys are accepted so verl command lines run unchanged, and
:mod:`rlforge.config.later_work` warns when one would matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from rlforge.config.profiler import FollowerProfilerConfig, follower_profiler


@dataclass
class SamplingConfig:
    """Sampling used for validation (``rollout.val_kwargs``)."""

    top_k: int = -1
    """Top-k cutoff; -1 = off."""
    top_p: float = 1.0
    """Nucleus cutoff; 1.0 = off."""
    temperature: float = 0.0
    """Softmax temperature; 0.0 = greedy."""
    n: int = 1
    """Responses per validation prompt."""
    do_sample: bool = False
    """Sample (True) or decode greedily (False)."""


@dataclass
class EngineKwargsConfig:
    """``rollout.engine_kwargs``: keyword arguments of verl's backends (free-form per backend, as in verl)."""

    vllm: dict[str, Any] = field(default_factory=dict)
    """vLLM engine arguments."""
    sglang: dict[str, Any] = field(default_factory=dict)
    """SGLang engine arguments."""
    trtllm: dict[str, Any] = field(default_factory=dict)
    """TensorRT-LLM engine arguments."""


@dataclass
class MultiTurnSchema:
    """``rollout.multi_turn``: verl's ``MultiTurnConfig`` keys and defaults, plus rlforge's ``tool_timeout_s``
    and ``max_tokens_per_turn`` (meanings: :class:`rlforge.rollout.multi_turn.config.MultiTurnConfig`)."""

    enable: bool = False
    """Run the agent loop (tools, interactions) instead of one response per prompt."""
    max_assistant_turns: int | None = None
    """Model turns per conversation; None = no limit."""
    tool_config_path: str | None = None
    """verl's tool config YAML; None = no tools."""
    max_user_turns: int | None = None
    """Inserted turns per conversation; None = no limit."""
    max_parallel_calls: int = 1
    """Tool calls run from one model turn."""
    max_tool_response_length: int = 256
    """Characters of one tool response the model reads."""
    tool_response_truncate_side: str = "middle"
    """``left`` | ``right`` | ``middle``."""
    interaction_config_path: str | None = None
    """verl's interaction config YAML; None = no interaction."""
    use_inference_chat_template: bool = False
    """verl: re-render turns with the inference template (warned: turns are never re-rendered here)."""
    tokenization_sanity_check_mode: str = "strict"
    """verl: re-tokenization check (warned: nothing is re-tokenized here)."""
    format: str = "hermes"
    """Tool-call format the model writes (``hermes``)."""
    num_repeat_rollouts: int | None = None
    """verl: repeat each multi-turn rollout (warned: ``rollout.n`` gives the responses per prompt)."""
    tool_timeout_s: float = 30.0
    """rlforge: wall seconds one tool call may take."""
    max_tokens_per_turn: int | None = None
    """rlforge: model tokens per assistant turn; None = no limit."""


@dataclass
class CustomAsyncServerConfig:
    """``rollout.agent.custom_async_server``: verl's user server class."""

    path: str | None = None
    """File of the class."""
    name: str | None = None
    """Class name."""


@dataclass
class AgentLoopConfig:
    """``rollout.agent``: verl's agent-loop workers (rlforge's agent loop runs in the training process)."""

    num_workers: int = 8
    """verl's agent-loop worker processes."""
    default_agent_loop: str = "single_turn_agent"
    """verl's agent loop for rows without an ``agent_name`` column."""
    agent_loop_config_path: str | None = None
    """verl's agent-loop registry YAML."""
    custom_async_server: CustomAsyncServerConfig = field(default_factory=CustomAsyncServerConfig)
    """verl's user server class."""
    agent_loop_manager_class: str | None = None
    """verl's user AgentLoopManager class (dotted name)."""


@dataclass
class TraceConfig:
    """``rollout.trace``: verl's rollout tracing (weave / mlflow)."""

    backend: str | None = None
    """Tracing backend; None = off."""
    token2text: bool = False
    """Decode token ids in the traces."""
    max_samples_per_step_per_worker: int | None = None
    """Samples traced per step and worker; None = all."""


VERL_ROLLOUTS: tuple[str, ...] = ("vllm", "sglang", "trtllm")
"""verl's rollout backends: accepted as ``rollout.name`` and run as rlforge's ``native`` engine (``hf``
where the native runner does not reproduce the model), with a warning."""


@dataclass
class RolloutConfig:
    """Generation of responses during training."""

    name: str = "vllm"
    """Backend: ``native`` (rlforge's paged-KV engine) | ``hf`` (transformers ``generate``) | ``vllm`` |
    ``sglang`` | ``trtllm`` (verl's; accepted: run as ``native`` for Llama/Qwen-family models, else ``hf``,
    with a warning)."""
    mode: str = "async"
    """``sync`` | ``async`` server mode of verl's backends (no effect here: the rollout runs in the training process)."""
    temperature: float = 1.0
    """Softmax temperature for training rollouts."""
    top_k: int = -1
    """Top-k cutoff; -1 = off."""
    top_p: float = 1.0
    """Nucleus cutoff; 1.0 = off."""
    prompt_length: int = II("data.max_prompt_length")
    """Prompt length in tokens; defaults to ``data.max_prompt_length``."""
    response_length: int = II("data.max_response_length")
    """Maximum new tokens per response; defaults to ``data.max_response_length``."""
    dtype: str = "bfloat16"
    """Dtype of the rollout model weights: ``bfloat16`` | ``float16`` | ``float32``."""
    gpu_memory_utilization: float = 0.5
    """Fraction of the GPU's total memory the rollout may hold for weights plus KV cache, as in
    vLLM (``native``; the KV cache is also capped at what every row needs at full length)."""
    ignore_eos: bool = False
    """Keep generating past EOS until ``response_length``."""
    enforce_eager: bool = False
    """Disable CUDA graphs in the backend (``native``: decode runs eagerly)."""
    cudagraph_capture_sizes: Any = None
    """Batch sizes captured as CUDA graphs (list of int); None = backend default."""
    free_cache_engine: bool = True
    """Release the KV cache (and CUDA graphs) after each rollout so training gets the memory back;
    ``native`` logs the cost as ``rollout/wake_s`` and ``rollout/sleep_s``."""
    load_format: str = "dummy_dtensor"
    """How the backend receives initial weights (vLLM only)."""
    layered_summon: bool = False
    """Gather FSDP weights layer by layer when syncing to the backend."""
    tensor_model_parallel_size: int = 2
    """Tensor-parallel degree of the rollout engine (verl's default 2).  With ``name=native`` a
    size T > 1 splits attention heads and MLP columns over groups of T consecutive ranks (it must
    divide the world and the model's attention and key/value heads; docs/rollout.md); verl's
    ``vllm``/``sglang`` names run the native engine with 1 (a warning says so)."""
    max_num_batched_tokens: int = 8192
    """Maximum tokens in one scheduler step of the backend."""
    max_model_len: int | None = None
    """Maximum sequence length of the backend; None = prompt_length + response_length."""
    max_num_seqs: int = 1024
    """Maximum concurrent sequences in the backend."""
    log_prob_micro_batch_size: int | None = None
    """Deprecated global micro batch for old log-prob recomputation; use the ``_per_gpu`` key.  None = unset."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Sequences per forward pass when recomputing old log-probs; None = whole batch."""
    log_prob_use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Pack micro batches by token count instead; defaults to ``actor.use_dynamic_bsz``."""
    log_prob_max_token_len_per_gpu: int = II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    """Token budget per packed micro batch (tokens); defaults to ``actor.ppo_max_token_len_per_gpu``."""
    disable_log_stats: bool = True
    """Silence the backend's periodic statistics."""
    enable_prefix_caching: bool = True
    """``native`` rollout: sequences share the KV blocks of identical full prompt blocks (the n samples
    of one prompt, and prompts opening with the same chat template text), prefilled once."""
    enable_chunked_prefill: bool = True
    """Chunked prefill in the backend."""
    do_sample: bool = True
    """Sample (True) or decode greedily (False) during training."""
    n: int = 1
    """Responses generated per prompt (group size for GRPO)."""
    over_sample_rate: float = 0.0
    """Fraction of extra requests issued and cancelled to cut tail latency; 0 = off."""
    multi_stage_wake_up: bool = False
    """Load backend weights and KV cache in stages to lower peak memory."""
    calculate_log_probs: bool = False
    """Return the rollout's own log-probs with each response as ``rollout_log_probs`` ``(batch,
    response_len)`` float32 nats, of ``softmax(logits / temperature)`` (``native`` only)."""
    engine_kwargs: EngineKwargsConfig = field(default_factory=EngineKwargsConfig)
    """Backend keyword arguments, one free-form mapping per verl backend (not used by native/hf: warned)."""
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)
    """Sampling used for validation."""
    multi_turn: MultiTurnSchema = field(default_factory=MultiTurnSchema)
    """verl's multi-turn/tool settings, checked further by
    :class:`rlforge.rollout.multi_turn.config.MultiTurnConfig`; ``enable: False`` = single turn.  Needs
    ``rollout.name=native``."""
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    """verl's agent-loop settings (not used: warned)."""
    trace: TraceConfig = field(default_factory=TraceConfig)
    """verl's rollout tracing settings (not used: warned)."""
    profiler: FollowerProfilerConfig = field(default_factory=follower_profiler)
    """verl's per-role profiler (:mod:`rlforge.config.profiler`); rlforge profiles whole steps."""
    update_weights_bucket_megabytes: int = 512
    """Bucket size for weight sync to the backend (MiB)."""
    skip_rollout: bool = False
    """Replay dumped rollouts from ``skip_dump_dir`` instead of generating (debugging)."""
    skip_dump_dir: str = "/tmp/rollout_dump"
    """Directory of those dumps."""

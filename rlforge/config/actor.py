"""``actor_rollout_ref.*``: the policy model, its actor (trainer), reference and rollout.

verl key names and defaults.  ``model`` is shared by actor, ref and rollout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from rlforge.config.common import CheckpointConfig, FSDPConfig, MegatronConfig, OptimConfig
from rlforge.config.profiler import RoleProfilerConfig
from rlforge.config.rollout import RolloutConfig

DEFAULT_MODEL = "smollm2-135m-instruct"
"""rlforge's short name of its default policy model (a preset resolved by ``rlforge.models``)."""


@dataclass
class FusedKernelOptions:
    """Options of the fused log-prob/entropy head (``actor_rollout_ref.model.fused_kernel_options``)."""

    impl_backend: str = "triton"
    """Implementation of each chunk's softmax statistics and logit gradient: ``triton`` (one Triton kernel
    each, :mod:`rlforge.roles.triton_head`, where the logits are on CUDA and Triton imports; the torch
    chunks elsewhere) or ``torch`` (plain-torch chunks, :mod:`rlforge.roles.fused_head`).  verl's keys
    and values; verl's default is ``torch``.  One setting for the actor and the reference."""
    chunk_size: int = 2048
    """Response positions (tokens) per chunk; >= 1.  Not a verl key.  Extra memory while the
    head runs is about 3 x chunk_size x vocab_size x 4 bytes (2048 x 151,936: ~3.7 GB); larger
    chunks make fewer, bigger matmuls."""


@dataclass
class ModelConfig:
    """The policy model (``actor_rollout_ref.model``)."""

    path: str = DEFAULT_MODEL
    """HF folder, Hugging Face Hub id (``org/name``, downloaded into the HF cache), GGUF file or rlforge preset
    name.  verl's default is a 7B path; rlforge uses its small preset."""
    tokenizer_path: str | None = None
    """Tokenizer location; None = same as ``path`` (for presets, the preset's tokenizer)."""
    custom_chat_template: str | None = None
    """Jinja chat template replacing the tokenizer's; None = tokenizer's own."""
    use_shm: bool = False
    """Copy weights to shared memory before loading (accepted; no effect)."""
    external_lib: str | None = None
    """Python module imported before loading the model (registers custom architectures); None = none."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Free-form overrides of the HF model config (e.g. ``attention_dropout``)."""
    enable_gradient_checkpointing: bool = True
    """Recompute activations in backward to save memory."""
    enable_activation_offload: bool = False
    """Offload activations to CPU during forward."""
    use_remove_padding: bool = False
    """Pack sequences without padding tokens in forward (varlen attention: ``rlforge_varlen`` on
    CUDA unless ``override_config.attn_implementation`` is set)."""
    lora_rank: int = 0
    """LoRA rank (peft ``r``); 0 = full fine-tuning; >= 0.  With a rank, only the adapter is
    trained, the reference is the base model with the adapter disabled and checkpoints hold the
    adapter (:mod:`rlforge.models.lora`)."""
    lora_alpha: int = 16
    """LoRA scaling numerator (scale = alpha / rank); > 0; only with ``lora_rank`` > 0."""
    target_modules: Any = "all-linear"
    """LoRA target modules: ``all-linear`` (every linear layer but the LM head), or a list of module
    names (suffixes, as peft matches them: ``[q_proj, v_proj]``) or one regex string matched
    against full module names.  An entry that matches no module is an error listing those that exist."""
    exclude_modules: Any = None
    """Modules excluded from LoRA (list of names or one regex, as ``target_modules``); None = none."""
    lora_adapter_path: str | None = None
    """A peft adapter folder (``adapter_config.json`` + weights) to start training from; its own
    rank, alpha and target modules are used.  None = a new adapter (``lora_rank`` > 0)."""
    use_liger: bool = False
    """Replace RMSNorm, the SwiGLU MLP and RoPE with liger-kernel's fused Triton kernels, in the
    actor, reference and rollout copies (:mod:`rlforge.engine.liger`).  CUDA with liger-kernel
    installed only; elsewhere a warning, and the eager modules run."""
    use_fused_kernels: bool = True
    """Compute log-probs and entropy of the actor and the reference from the LM head in chunks of
    ``fused_kernel_options.chunk_size`` response positions, never materialising the
    ``(tokens, vocab)`` logits of the whole sequence (:mod:`rlforge.roles.fused_head`); false =
    the model's full logits.  Default true, unlike verl's false: the chunked head gives the same
    log-probs and gradients (to float rounding) and needs no model patching.  Models whose logits
    are not exactly ``lm_head(hidden)`` (soft-capping, scaling) use the full logits with a warning;
    ``strategy=megatron`` keeps its own vocabulary-parallel path."""
    fused_kernel_options: FusedKernelOptions = field(default_factory=FusedKernelOptions)
    """Options of the fused (chunked) head."""
    trust_remote_code: bool = False
    """Allow model code from the repository to run."""


@dataclass
class FlowRLConfig:
    """FlowRL trajectory-balance loss (``actor.policy_loss.flowrl``; read when ``loss_mode=flowrl``).

    Zhu et al. 2025, "FlowRL: Matching Reward Distributions for LLM Reasoning", eq. 6-7; see
    ``rlforge.algorithms.flowrl``.  Not a verl key (verl has FlowRL only as a recipe).
    """

    beta: float = 15.0
    """Reward scale beta in ``delta = log Z + mean log pi - beta * r_hat - mean log pi_ref`` (paper: 15); >= 0."""
    reward: str = "group_norm"
    """``r_hat``: ``group_norm`` = (score - group mean) / (group std + 1e-6) as GRPO; ``raw`` = sum of token rewards."""
    use_ref: bool = True
    """Keep the reference term ``mean_t log pi_ref``; false = uniform reference, term omitted (no ref forward needed)."""
    weight_clamp_max: float | None = 10.0
    """Upper clamp of the importance weight ``exp(sum_t (log pi - log pi_old))`` (a ratio, > 0); null = no upper clamp."""
    weight_clamp_min: float | None = None
    """Lower clamp of that weight (>= 0, below ``weight_clamp_max``); null = no lower clamp."""
    log_z_hidden_size: int = 256
    """Hidden width (units) of the MLP head predicting log Z(x) from the prompt's last hidden state; >= 1."""
    export_log_z: bool = False
    """Also write the log Z head (``log_z_head.safetensors``) into exported Hugging Face folders
    (``actor.checkpoint.save_contents`` with ``hf_model``); by default the export is the policy alone."""
    log_z_lr_multiplier: float = 1.0
    """Learning rate of the log-Z head = ``actor.optim.lr`` times this factor; > 0."""


@dataclass
class PolicyLossConfig:
    """Policy-loss variant (``actor.policy_loss``)."""

    loss_mode: str = "vanilla"
    """Policy-loss registry name: ``vanilla`` (PPO clip), ``gspo``, ``sapo``, ``gpg``, ``clip_cov``, ``kl_cov``,
    ``geo_mean``, ``cispo``, ``dppo_tv``, ``dppo_kl`` (``clip_ratio_low``/``_high`` are then divergence
    thresholds), ``dro``, ``flowrl``."""
    clip_cov_ratio: float = 0.0002
    """Fraction of valid tokens whose gradient ``clip_cov`` drops (at least one token); > 0."""
    clip_cov_lb: float = 1.0
    """``clip_cov`` candidates have covariance strictly above this bound."""
    clip_cov_ub: float = 5.0
    """``clip_cov`` candidates have covariance strictly below this bound (> ``clip_cov_lb``)."""
    kl_cov_ratio: float = 0.0002
    """Fraction of valid tokens (largest covariance, at least one) that ``kl_cov`` penalises; > 0."""
    ppo_kl_coef: float = 0.1
    """Coefficient of the ``|log pi - log pi_old|`` penalty in ``kl_cov`` (per token, nats)."""
    dro_beta: float | None = None
    """DRO's quadratic penalty ``beta / 2 * (log pi - log pi_old)^2`` per token (``loss_mode=dro``, where it
    must be > 0; verl's example 0.05); null = unset."""
    flowrl: FlowRLConfig = field(default_factory=FlowRLConfig)
    """FlowRL settings (``loss_mode=flowrl``)."""


@dataclass
class ActorConfig:
    """Policy training (``actor_rollout_ref.actor``)."""

    strategy: str = "fsdp"
    """Training engine: ``fsdp`` | ``fsdp2`` | ``megatron``."""
    ppo_mini_batch_size: int = 256
    """Prompts per optimizer step (each with ``rollout.n`` responses)."""
    ppo_micro_batch_size: int | None = None
    """Deprecated global micro batch; use ``ppo_micro_batch_size_per_gpu``.  None = unset."""
    ppo_micro_batch_size_per_gpu: int | None = None
    """Sequences per forward/backward (gradient accumulation unit); None = whole mini batch."""
    use_dynamic_bsz: bool = False
    """Pack micro batches by token count (``ppo_max_token_len_per_gpu``) instead of sequence count."""
    ppo_max_token_len_per_gpu: int = 16384
    """Token budget per packed micro batch (tokens)."""
    grad_clip: float = 1.0
    """Gradient-norm clip (L2); <= 0 = no clipping."""
    clip_ratio: float = 0.2
    """PPO clip epsilon (used when the low/high values are not set apart)."""
    clip_ratio_low: float = 0.2
    """Lower clip epsilon: ratio >= 1 - clip_ratio_low."""
    clip_ratio_high: float = 0.2
    """Upper clip epsilon: ratio <= 1 + clip_ratio_high (DAPO clip-higher)."""
    clip_ratio_c: float = 3.0
    """Dual-clip constant for negative advantages (> 1); for ``dppo_tv``/``dppo_kl`` the cap of the truncated
    importance ratio (verl's DPPO example sets 10000)."""
    tau_pos: float = 1.0
    """SAPO gate temperature for tokens with positive advantage (``policy_loss.loss_mode=sapo``); > 0."""
    tau_neg: float = 1.05
    """SAPO gate temperature for tokens with negative advantage (larger = faster decay off-policy); > 0."""
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Policy-loss variant."""
    loss_agg_mode: str = "token-mean"
    """Loss aggregation: ``token-mean`` | ``token-sum`` | ``seq-mean-token-sum`` | ``seq-mean-token-mean`` |
    ``seq-mean-token-sum-norm``."""
    calculate_sum_pi_squared: bool = False
    """The ``old_log_prob`` stage also computes ``sum_v pi_v^2`` per response token (the optimal token
    baseline's variance proxy; required by ``algorithm.adv_estimator=optimal_token_baseline`` and
    ``tir_optimal_token_baseline``).  That forward then takes the padded full-logits path, and the stage
    always runs (its output is read before the update)."""
    entropy_coeff: float = 0.0
    """Entropy bonus coefficient; 0 = off."""
    use_kl_loss: bool = False
    """Add a KL(actor || ref) loss term (GRPO style) instead of a KL reward penalty."""
    use_torch_compile: bool = False
    """On CUDA, ``torch.compile`` each decoder layer's MLP and norms (regional compile,
    :mod:`rlforge.engine.compile`: fused elementwise kernels forward and backward); the first
    steps pay the compile time.  Ignored on CPU (eager reference path).  Default False, unlike
    verl's True: on one H200 it made the 1.5B/0.5B training step 6%/17% slower without
    checkpointing and 3% faster with it (benchmarks/history/RESULTS-log.md, 2026-12-01)."""
    kl_loss_coef: float = 0.001
    """Coefficient of that KL loss."""
    kl_loss_type: str = "low_var_kl"
    """KL estimator: ``kl`` (k1) | ``abs`` | ``mse`` (k2) | ``low_var_kl`` (k3) | ``full``."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    recompute_old_log_prob: bool | None = None
    """rlforge addition: the ``old_log_prob`` stage (a forward over the whole batch before the
    update).  None = skip it when the batch is consumed by exactly one optimizer step
    (``ppo_epochs=1``, ``ppo_mini_batch_size == data.train_batch_size``) and nothing reads the
    old log-probs before the update (no ``algorithm.use_kl_in_reward``; not a pipeline-parallel
    actor): the update then uses its own forward's detached log-probs as the old ones (what
    verl's actor does on-policy) and reports ``actor/entropy`` and ``training/rollout_probs_diff_*``
    from that forward.  True = always run the stage; False = skip it (a ConfigError where the
    batch is not on-policy)."""
    shuffle: bool = False
    """Shuffle the rollout batch before splitting into mini batches."""
    use_prefix_grouper: bool | None = None
    """verl's key (PrefixGrouper, Liu et al. 2025, arXiv:2506.05433): rows of a micro-batch with the
    same prompt (the ``rollout.n`` samples of a prompt) run that prompt once in the actor's forwards
    (update and ``old_log_prob``); each response attends to the one copy, so log-probs and gradients
    are those of the unshared rows (:class:`rlforge.engine.packing.PackPlan`).  Token-budget
    micro-batches then keep a prompt's rows together and count the prompt once.  Needs the
    padding-free forward on ``rlforge_varlen`` attention (``model.use_remove_padding=true``, chosen on
    CUDA).  True = on, with a warning where it cannot take effect; False = off (verl's default);
    None (rlforge's default) = on wherever it can take effect and ``rollout.n`` > 1, silently off
    elsewhere.  Measured on one H200 (benchmarks/history/RESULTS-log.md, 2026-12-02): the e2e GRPO update
    (64 prompts x 8, 256 + 1,024 tokens) 5.38 -> 4.97 s on 0.5B and 12.93 -> 11.22 s on 1.5B.
    ``perf/mfu/*`` count the FLOPs of the unshared rows; ``perf/hfu/actor`` leaves out the prompt
    copies not computed (logged as ``perf/prefix_grouper/saved_tokens``)."""
    ulysses_sequence_parallel_size: int = 1
    """Ulysses sequence-parallel degree; 1 = off."""
    entropy_from_logits_with_chunking: bool = False
    """Compute entropy in chunks to save memory."""
    entropy_checkpointing: bool = False
    """Recompute entropy in backward to save memory."""
    use_remove_padding: bool = II("actor_rollout_ref.model.use_remove_padding")
    """Defaults to ``model.use_remove_padding``."""
    use_fused_kernels: bool = II("actor_rollout_ref.model.use_fused_kernels")
    """Defaults to ``model.use_fused_kernels``."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpoint contents."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule (verl default lr 1e-6)."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP settings (``strategy`` fsdp/fsdp2)."""
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    """Megatron settings (``strategy=megatron``)."""
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    """verl's per-role profiler (:mod:`rlforge.config.profiler`); rlforge profiles whole steps."""


def _ref_megatron() -> MegatronConfig:
    """The reference's ``megatron`` block: tensor/pipeline/virtual-pipeline sizes follow the actor's."""
    actor = "actor_rollout_ref.actor.megatron"
    return MegatronConfig(
        tensor_model_parallel_size=II(f"{actor}.tensor_model_parallel_size"),
        pipeline_model_parallel_size=II(f"{actor}.pipeline_model_parallel_size"),
        virtual_pipeline_model_parallel_size=II(f"{actor}.virtual_pipeline_model_parallel_size"),
    )


@dataclass
class RefConfig:
    """Frozen reference policy for KL (``actor_rollout_ref.ref``)."""

    strategy: str = II("actor_rollout_ref.actor.strategy")
    """Engine; defaults to ``actor.strategy``."""
    use_torch_compile: bool = II("actor_rollout_ref.actor.use_torch_compile")
    """Defaults to ``actor.use_torch_compile``."""
    log_prob_micro_batch_size: int | None = None
    """Deprecated global micro batch; use the ``_per_gpu`` key.  None = unset."""
    log_prob_micro_batch_size_per_gpu: int | None = None
    """Sequences per reference forward pass; None = whole batch."""
    log_prob_use_dynamic_bsz: bool = II("actor_rollout_ref.actor.use_dynamic_bsz")
    """Pack by tokens; defaults to ``actor.use_dynamic_bsz``."""
    log_prob_max_token_len_per_gpu: int = II("actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    """Token budget per packed micro batch (tokens); defaults to the actor's."""
    ulysses_sequence_parallel_size: int = II("actor_rollout_ref.actor.ulysses_sequence_parallel_size")
    """Defaults to ``actor.ulysses_sequence_parallel_size``."""
    entropy_from_logits_with_chunking: bool = False
    """Compute entropy in chunks to save memory."""
    entropy_checkpointing: bool = False
    """Recompute entropy in backward."""
    model: dict[str, Any] | None = None
    """Separate reference model settings; None = same as ``actor_rollout_ref.model``."""
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP settings."""
    megatron: MegatronConfig = field(default_factory=lambda: _ref_megatron())
    """Megatron settings; the parallel sizes default to the actor's (as verl's ``megatron_ref.yaml``)."""
    profiler: RoleProfilerConfig = field(default_factory=RoleProfilerConfig)
    """verl's per-role profiler (:mod:`rlforge.config.profiler`); rlforge profiles whole steps."""


@dataclass
class ActorRolloutRefConfig:
    """The policy group: one model used by actor, ref and rollout."""

    hybrid_engine: bool = True
    """Actor and rollout share devices and weights (the only mode rlforge runs)."""
    nccl_timeout: int = 600
    """Timeout of the job's process group (seconds): how long a collective waits before it fails."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """Policy model."""
    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy training."""
    ref: RefConfig = field(default_factory=RefConfig)
    """Reference policy."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""

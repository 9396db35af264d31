"""Build the parts of one RL job from its config: tokenizer, roles, rollout, rewards, data.

Everything that depends on which backend or strategy is chosen is picked from a
registry here, so the step loop in :mod:`rlforge.trainer.ppo_trainer` only talks to
interfaces.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from rlforge.algorithms import POLICY_LOSSES
from rlforge.config import uses_critic
from rlforge.data import PromptLoader, load_rl_dataset
from rlforge.engine import ENGINES, TrainEngine
from rlforge.engine.adapter_off import AdapterOffEngine
from rlforge.engine.base import copy_full_params
from rlforge.engine.distributed import init_distributed, init_single_process
from rlforge.engine.varlen import ATTN_IMPLEMENTATION, attn_implementation, maybe_select_varlen
from rlforge.errors import ConfigError
from rlforge.launch import under_launcher
from rlforge.models import load_causal_lm, load_tokenizer, load_value_model
from rlforge.models.log_z import PolicyWithLogZ
from rlforge.models.lora import (
    LoraPlan,
    adapted_names,
    apply_lora,
    lora_enabled,
    lora_strategy,
    merged_params,
)
from rlforge.rewards import RewardManager, build_reward_manager
from rlforge.rewards.model_reward import with_model_reward
from rlforge.roles.actor import Actor, LogProbModel
from rlforge.roles.critic import Critic
from rlforge.roles.fused_head import fused_head_unsupported, set_impl_backend
from rlforge.rollout import ROLLOUTS, Rollout
from rlforge.rollout.multi_turn.setup import maybe_multi_turn, prompt_tool_schemas
from rlforge.trainer import spmd


def pick_device(name: str) -> torch.device:
    """``trainer.device``: ``auto`` = CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        from rlforge.errors import ConfigError

        raise ConfigError(f"trainer.device={name} but no CUDA GPU is visible; use trainer.device=cpu or auto")
    return torch.device(name)


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """bfloat16 autocast on CUDA (float32 master weights), none on CPU."""
    return torch.bfloat16 if device.type == "cuda" else None


def _prefix_grouper(module: torch.nn.Module, packed: bool, choice: bool | None, n: int) -> bool:
    """Whether ``actor.use_prefix_grouper`` takes effect.  ``choice`` True: on the padding-free
    forward (``packed``; otherwise ``config.later_work`` has warned) with ``rlforge_varlen``
    attention (a warning where the model has another, e.g. on CPU, where it is chosen only by
    ``model.override_config.attn_implementation=rlforge_varlen``).  None (the default): the same,
    without warnings, and only where a prompt has several responses (``rollout.n`` = ``n`` > 1).
    False: never."""
    if choice is False or not packed or (choice is None and n <= 1):
        return False
    impl = attn_implementation(module)
    if impl != ATTN_IMPLEMENTATION:
        if choice is None:
            return False
        warnings.warn(f"actor_rollout_ref.actor.use_prefix_grouper=True needs the {ATTN_IMPLEMENTATION!r} attention, "
                      f"the model has {impl!r} (it is chosen on CUDA, or by actor_rollout_ref.model.override_config."
                      f"attn_implementation={ATTN_IMPLEMENTATION}); ignored", stacklevel=2)
        return False
    return True


def _check_context_length(cfg: Any, module: torch.nn.Module) -> None:
    """The longest sequence (prompt + response) must fit the model's ``max_position_embeddings``."""
    c = getattr(module.config, "text_config", None) or module.config
    limit = getattr(c, "max_position_embeddings", None)
    longest = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    if limit and longest > int(limit):
        raise ConfigError(
            f"data.max_prompt_length + data.max_response_length = {longest} is longer than the model's "
            f"max_position_embeddings={limit} ({cfg.actor_rollout_ref.model.path}); lower data.max_response_length"
        )


def rollout_name(cfg: Any, module: torch.nn.Module) -> str:
    """``rollout.name``; verl's ``vllm``/``sglang`` run as ``native`` where the model is one the
    native runner reproduces (Llama/Qwen family), with one model copy per GPU whatever
    ``tensor_model_parallel_size`` says (a warning says so), otherwise as ``hf``."""
    from rlforge.rollout.native.model_runner import unsupported_reason

    r = cfg.actor_rollout_ref.rollout
    if r.name in ROLLOUTS:
        return r.name
    return "native" if unsupported_reason(module) is None else "hf"


def per_step_sizes(cfg: Any, world_size: int = 1) -> dict[str, int]:
    """Per-rank sequence counts derived from verl's prompt-count keys.

    ``ppo_mini_batch_size`` counts prompts and is multiplied by ``rollout.n``; micro-batch
    sizes count sequences.  An unset micro-batch size means one micro-batch per mini-batch.
    The deprecated global ``*_micro_batch_size`` keys equal the per-GPU ones on one device.
    Mini-batches are split evenly over the ``world_size`` data-parallel ranks.
    """
    n = cfg.actor_rollout_ref.rollout.n
    actor = cfg.actor_rollout_ref.actor
    rollout = cfg.actor_rollout_ref.rollout
    ref = cfg.actor_rollout_ref.ref
    critic = cfg.critic
    dp = max(1, world_size)
    mini = actor.ppo_mini_batch_size * n // dp
    micro = actor.ppo_micro_batch_size_per_gpu or actor.ppo_micro_batch_size or mini
    critic_mini = (critic.ppo_mini_batch_size or actor.ppo_mini_batch_size) * n // dp
    critic_micro = critic.ppo_micro_batch_size_per_gpu or critic.ppo_micro_batch_size or critic_mini
    return {
        "actor_mini": mini,
        "actor_micro": micro,
        "log_prob_micro": rollout.log_prob_micro_batch_size_per_gpu or rollout.log_prob_micro_batch_size or micro,
        "ref_micro": ref.log_prob_micro_batch_size_per_gpu or ref.log_prob_micro_batch_size or micro,
        "critic_mini": critic_mini,
        "critic_micro": critic_micro,
        "critic_forward_micro": critic.forward_micro_batch_size_per_gpu or critic.forward_micro_batch_size
        or critic_micro,
    }


def token_budgets(cfg: Any) -> dict[str, int | None]:
    """Token budgets per micro-batch (``*_max_token_len_per_gpu``) where dynamic batching is on
    (``use_dynamic_bsz`` / ``log_prob_use_dynamic_bsz``), else None."""
    arr, critic = cfg.actor_rollout_ref, cfg.critic

    def pick(on: bool, value: int) -> int | None:
        return int(value) if on else None

    return {
        "actor": pick(arr.actor.use_dynamic_bsz, arr.actor.ppo_max_token_len_per_gpu),
        "log_prob": pick(arr.rollout.log_prob_use_dynamic_bsz, arr.rollout.log_prob_max_token_len_per_gpu),
        "ref": pick(arr.ref.log_prob_use_dynamic_bsz, arr.ref.log_prob_max_token_len_per_gpu),
        "critic": pick(critic.use_dynamic_bsz, critic.ppo_max_token_len_per_gpu),
        "critic_forward": pick(critic.use_dynamic_bsz, critic.forward_max_token_len_per_gpu),
    }


def total_training_steps(cfg: Any, batches_per_epoch: int) -> int:
    """``trainer.total_training_steps`` if set, else ``total_epochs × batches per epoch``."""
    if cfg.trainer.total_training_steps is not None:
        return int(cfg.trainer.total_training_steps)
    return int(cfg.trainer.total_epochs) * batches_per_epoch


def critic_model_path(cfg: Any) -> str:
    """``critic.model.path``, or the actor's model path when unset (as verl's default)."""
    return cfg.critic.model.path or cfg.actor_rollout_ref.model.path


@dataclass
class Job:
    """The built parts of one job."""

    tokenizer: Any
    device: torch.device
    actor: Actor
    actor_lm: torch.nn.Module
    ref: LogProbModel | None
    critic: Critic | None
    rollout: Rollout
    reward: RewardManager
    train_loader: PromptLoader
    val_loader: PromptLoader | None
    total_steps: int
    sync_rollout: Any  # () -> None: make the actor's new weights visible to the rollout
    actor_lora: LoraPlan | None = None  # the actor's LoRA adapter (model.lora_rank > 0), else None


def _engine(name: str, module: torch.nn.Module, device: torch.device, *, fsdp_config: Any, optim_cfg: Any | None,
            total_steps: int, optim_key: str, grad_clip: float = 1.0, param_groups: Any = None,
            model_cfg: Any = None, megatron_config: Any = None, role_key: str = "",
            compile_layers: bool = False) -> TrainEngine:
    """Build the engine registered as ``name`` (``local``, ``fsdp2``, ``fsdp``, ``megatron``) around
    ``module``; ``role_key`` (e.g. ``critic``) is the role's config prefix, named in errors."""
    return ENGINES.get(name)(
        module, device, fsdp_config=fsdp_config, optim_cfg=optim_cfg, total_steps=total_steps, optim_key=optim_key,
        grad_clip=grad_clip, param_groups=param_groups, megatron_config=megatron_config, role_key=role_key,
        gradient_checkpointing=bool(model_cfg is not None and model_cfg.enable_gradient_checkpointing),
        activation_offload=bool(model_cfg is not None and model_cfg.enable_activation_offload),
        compile_layers=compile_layers,
    )


def _packs(strategy: str) -> bool:
    """Whether the engine for ``strategy`` runs the roles' packed forward (``TrainEngine.packed_forward``)."""
    return bool(getattr(ENGINES.get(engine_name(strategy)), "packed_forward", True))


def head_chunk_size(use_fused_kernels: bool, model_cfg: Any, module: torch.nn.Module, engine: TrainEngine,
                    key: str) -> int:
    """Positions per chunk of the chunked LM-head log-probs (``model.fused_kernel_options.chunk_size``)
    when ``use_fused_kernels`` (config key ``key``), the engine can read the head's weight after
    forward and the model's logits are exactly ``lm_head(hidden)``; else 0 (the model's full
    logits), with a warning when the engine or the model is the reason."""
    if not use_fused_kernels:
        return 0
    reason = fused_head_unsupported(module)
    if reason is None and not engine.head_readable_after_forward:
        reason = (f"the {type(engine).__name__} re-shards or splits the LM head after forward "
                  "(use actor_rollout_ref.actor.strategy=fsdp2 for the chunked head)")
    if reason is not None:
        warnings.warn(f"{key}=true but {reason}; using the model's full logits", stacklevel=2)
        return 0
    set_impl_backend(model_cfg.fused_kernel_options.impl_backend)
    return int(model_cfg.fused_kernel_options.chunk_size)


def engine_name(strategy: str) -> str:
    """The registered engine of ``actor.strategy`` / ``critic.strategy`` (``fsdp`` = FSDP1, ``fsdp2``,
    ``megatron``), whatever the number of processes: one process runs the same sharded engine on
    a one-device mesh (:func:`~rlforge.engine.distributed.init_single_process`), so offload, mixed
    precision, reshard and prefetch keys mean the same on 1 device and on N."""
    return strategy


def rollout_weights_dtype(device: torch.device) -> torch.dtype:
    """dtype of the rollout's own copy of the policy: the compute dtype (bfloat16 on CUDA, where the
    rollout would cast the float32 master weights to it anyway; float32 on CPU)."""
    return autocast_dtype(device) or torch.float32


def build_job(cfg: Any) -> Job:
    """Load models and data and wire them together.

    Raises:
        RLForgeError subclasses for bad paths, files or rows.
    """
    device = pick_device(cfg.trainer.device)
    # One process per device under a launcher; else a one-rank group in this process, so that
    # the same sharded engine runs on 1 device and on N.
    device = init_distributed(device.type).device if under_launcher() else init_single_process(device).device
    arr = cfg.actor_rollout_ref
    seed = int(cfg.data.seed if cfg.data.seed is not None else 1)
    tokenizer = load_tokenizer(arr.model.path, arr.model.tokenizer_path)

    tools = prompt_tool_schemas(cfg)  # rendered by the chat template's tools= where it renders them
    train_ds = load_rl_dataset(cfg.data.train_files, tokenizer, cfg.data, split="train", tools=tools)
    train_loader = PromptLoader(train_ds, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=seed)
    val_loader = None
    if cfg.data.val_files:
        val_ds = load_rl_dataset(cfg.data.val_files, tokenizer, cfg.data, split="val", tools=tools)
        val_bs = cfg.data.val_batch_size or len(val_ds)
        val_loader = PromptLoader(
            val_ds, min(val_bs, len(val_ds)), shuffle=False, seed=seed, drop_last=False,
            batch_size_key="data.val_batch_size",
        )
    steps = total_training_steps(cfg, len(train_loader))
    sizes = per_step_sizes(cfg, spmd.world()[1])
    budgets = token_budgets(cfg)
    remove_padding = bool(arr.model.use_remove_padding)

    actor_module = load_causal_lm(arr.model.path, tokenizer, dict(arr.model.override_config or {}), seed=seed)
    _check_context_length(cfg, actor_module)
    # Before the reference copy, so that it packs the same way.
    maybe_select_varlen(actor_module, device, remove_padding and _packs(arr.actor.strategy), arr.model.override_config)
    if arr.model.use_liger:
        from rlforge.engine.liger import apply_liger

        apply_liger(actor_module, device)  # before the reference and rollout copies: all three use the kernels
    # A policy loss declares what it needs (FlowRL: a log Z head, maybe the reference).
    loss_fn = POLICY_LOSSES.get(arr.actor.policy_loss.loss_mode)
    needs_log_z = bool(getattr(loss_fn, "needs_log_z", False))
    loss_needs_ref = bool(getattr(loss_fn, "needs_ref_log_prob", lambda _cfg: False)(arr.actor))
    need_ref = arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward or loss_needs_ref
    ref = None
    lora: LoraPlan | None = None
    rollout_copy: torch.nn.Module | None = None
    if lora_enabled(arr.model):
        # The rollout's copy is the plain base model (the adapter is merged into it on every sync);
        # the reference is the actor's own module with the adapter off (built after the actor).
        rollout_copy = copy.deepcopy(actor_module).to(dtype=rollout_weights_dtype(device))
        lora = apply_lora(actor_module, arr.model, "actor_rollout_ref.model", str(arr.model.path), seed=seed)
    if need_ref and lora is None:
        ref_module = copy.deepcopy(actor_module).requires_grad_(False)
        ref_engine = _engine(engine_name(arr.actor.strategy), ref_module, device, fsdp_config=arr.ref.fsdp_config,
                             optim_cfg=None, total_steps=steps, optim_key="", megatron_config=arr.ref.megatron,
                             role_key="actor_rollout_ref.ref", compile_layers=bool(arr.ref.use_torch_compile))
        ref = LogProbModel(ref_engine, sizes["ref_micro"], budgets["ref"], remove_padding and ref_engine.packed_forward,
                           head_chunk_size(arr.model.use_fused_kernels, arr.model, ref_module, ref_engine,
                                           "actor_rollout_ref.model.use_fused_kernels"))
    trained: torch.nn.Module = actor_module
    param_groups = None
    if needs_log_z:
        flow = arr.actor.policy_loss.flowrl
        trained = PolicyWithLogZ(actor_module, int(flow.log_z_hidden_size))
        param_groups = [(lambda name: name.startswith("log_z_head."), float(flow.log_z_lr_multiplier))]
    # The engine shards the actor (also on one device: its parameters become DTensors), so the
    # rollout generates with its own full copy in the compute dtype, refreshed from the shards
    # after every update, one tensor at a time.
    if rollout_copy is None:
        rollout_copy = copy.deepcopy(trained).to(dtype=rollout_weights_dtype(device))
    actor_engine = _engine(
        engine_name(lora_strategy(arr.actor.strategy, arr.model)), trained, device, fsdp_config=arr.actor.fsdp_config,
        optim_cfg=arr.actor.optim,
        total_steps=steps, optim_key="actor_rollout_ref.actor.optim", grad_clip=arr.actor.grad_clip,
        param_groups=param_groups, model_cfg=arr.model, megatron_config=arr.actor.megatron,
        role_key="actor_rollout_ref.actor", compile_layers=bool(arr.actor.use_torch_compile),
    )
    actor = Actor(actor_engine, arr.actor, sizes["actor_mini"], sizes["actor_micro"], sizes["log_prob_micro"],
                  with_log_z=needs_log_z, max_token_len=budgets["actor"], log_prob_max_token_len=budgets["log_prob"],
                  remove_padding=remove_padding and actor_engine.packed_forward,
                  head_chunk_size=head_chunk_size(arr.actor.use_fused_kernels, arr.model, actor_module,
                                                  actor_engine, "actor_rollout_ref.actor.use_fused_kernels"))
    if arr.actor.use_prefix_grouper is not False:
        share = _prefix_grouper(actor_module, remove_padding and actor_engine.packed_forward,
                                arr.actor.use_prefix_grouper, int(arr.rollout.n))
        actor_engine.share_prompts = share  # also the LoRA reference's engine (the adapter off)
        if ref is not None:
            ref.engine.share_prompts = share
    if lora is not None:
        actor_engine.trainable_state_only = True  # checkpoints hold the adapter and its optimizer state
        if need_ref:
            ref = LogProbModel(AdapterOffEngine(actor_engine), sizes["ref_micro"], budgets["ref"],
                               remove_padding and actor_engine.packed_forward, actor.head_chunk_size)

    critic = None
    if uses_critic(cfg):
        critic_module = load_value_model(
            critic_model_path(cfg), tokenizer, dict(cfg.critic.model.override_config or {}), seed=seed
        )
        maybe_select_varlen(critic_module, device, bool(cfg.critic.model.use_remove_padding)
                            and _packs(cfg.critic.strategy), cfg.critic.model.override_config)
        critic_lora = lora_enabled(cfg.critic.model)
        if critic_lora:  # the value head is trained whole beside the adapter
            apply_lora(critic_module, cfg.critic.model, "critic.model", critic_model_path(cfg), trainable=("score",),
                       seed=seed)
        critic_engine = _engine(
            engine_name(lora_strategy(cfg.critic.strategy, cfg.critic.model)), critic_module, device,
            fsdp_config=cfg.critic.model.fsdp_config,
            optim_cfg=cfg.critic.optim, total_steps=steps, optim_key="critic.optim", grad_clip=cfg.critic.grad_clip,
            model_cfg=cfg.critic.model, megatron_config=cfg.critic.megatron, role_key="critic",
        )
        critic_engine.trainable_state_only = critic_lora
        critic = Critic(critic_engine, cfg.critic, sizes["critic_mini"], sizes["critic_micro"],
                        sizes["critic_forward_micro"], budgets["critic"], budgets["critic_forward"],
                        bool(cfg.critic.model.use_remove_padding) and critic_engine.packed_forward)

    eos_ids = _eos_ids(tokenizer, actor_module)
    rollout_copy.to(device)
    rollout_lm = rollout_copy.lm if isinstance(rollout_copy, PolicyWithLogZ) else rollout_copy
    prefix = "lm." if needs_log_z else ""
    rollout = ROLLOUTS.get(rollout_name(cfg, rollout_lm)).from_config(
        rollout_lm, eos_ids, tokenizer.pad_token_id, device, autocast_dtype(device), arr.rollout,
    )
    rollout = maybe_multi_turn(rollout, cfg, tokenizer)  # rollout.multi_turn.enable: the agent loop
    # a reward model or judge (reward_model.enable / reward_model.judge.enable) wraps the manager
    reward = with_model_reward(build_reward_manager(cfg, tokenizer), cfg, device, seed, autocast_dtype(device))
    def sync_rollout() -> None:
        if lora is None:
            actor_engine.sync_to(rollout_copy)  # gathers full tensors one at a time (bounded memory)
            return
        # LoRA: only the adapted layers change; each is gathered and merged (W + scaling * B @ A).
        full = actor_engine.full_params_iter(keep=adapted_names(lora, prefix))
        copy_full_params(merged_params(full, lora, prefix), rollout_lm)

    if lora is not None and arr.model.lora_adapter_path:
        sync_rollout()  # the starting adapter is not zero
    return Job(tokenizer, device, actor, rollout_lm, ref, critic, rollout, reward, train_loader, val_loader, steps,
               sync_rollout, lora)


def _eos_ids(tokenizer: Any, module: torch.nn.Module) -> list[int]:
    ids: list[int] = []
    gen_eos = getattr(getattr(module, "generation_config", None), "eos_token_id", None)
    for e in [tokenizer.eos_token_id, *(gen_eos if isinstance(gen_eos, list) else [gen_eos])]:
        if e is not None and int(e) not in ids:
            ids.append(int(e))
    return ids

"""verl's keys that rlforge's schema does not type: the aliases onto rlforge keys and the keys that
are accepted and warned about (data, not code; the loader and :mod:`rlforge.config.later_work` read it).

Pinned to verl ``b178a3c`` (0.8.0.dev): every leaf key of ``verl/trainer/config/_generated_ppo_trainer.yaml``
and ``_generated_ppo_megatron_trainer.yaml`` is either typed in rlforge's schema (takes effect or warns
through ``later_work.LATER_WORK``), an alias here (:data:`ALIASES`: the value goes to rlforge's key), or a
verl-only key here (:data:`VERL_ONLY`, with verl's default): accepted, and a value other than verl's
default warns with the reason (:data:`REASONS`) and what rlforge does instead.  Newer verl blocks whose
sub-keys are all accepted and warned: :data:`OPEN_PREFIXES`.  ``tests/config/test_verl_schema.py`` checks
the whole generated configs against this.  :class:`KeyTable` bundles one entry point's tables: :data:`PPO`
here, the SFT trainer's in :mod:`rlforge.config.verl_sft_keys`; the module-level functions are :data:`PPO`'s.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

VERL_PIN = "b178a3c (0.8.0.dev)"
"""The verl commit whose generated configs this table covers."""

_A, _R, _O = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout"
_MODELS = ("actor_rollout_ref.model", "critic.model")
_LORA = {"rank": "lora_rank", "alpha": "lora_alpha", "target_modules": "target_modules",
         "exclude_modules": "exclude_modules", "adapter_path": "lora_adapter_path"}
_ROLE_FROM_FSDP = ("ulysses_sequence_parallel_size", "entropy_from_logits_with_chunking", "use_torch_compile",
                   "entropy_checkpointing")

ALIASES: dict[str, str] = {
    f"{_A}.optim.clip_grad": f"{_A}.grad_clip",
    "critic.optim.clip_grad": "critic.grad_clip",
    f"{_O}.checkpoint_engine.update_weights_bucket_megabytes": f"{_O}.update_weights_bucket_megabytes",
    "reward_manager.name": "reward_model.reward_manager",
    "critic.model.fsdp_config.ulysses_sequence_parallel_size": "critic.ulysses_sequence_parallel_size",
    **{f"{role}.fsdp_config.{k}": f"{role}.{k}" for role in (_A, _R) for k in _ROLE_FROM_FSDP},
    **{f"{m}.lora.{k}": f"{m}.{v}" for m in _MODELS for k, v in _LORA.items()},
    # verl's DAPO scripts hand the over-long penalty to its dapo reward manager as constructor keywords
    **{f"reward_model.reward_kwargs.overlong_buffer_cfg.{k}": f"reward_model.overlong_buffer.{k}"
       for k in ("enable", "len", "penalty_factor", "log")},
}
"""verl key -> rlforge key: the value is set on rlforge's key (``optim.clip_grad`` is the actor's
``grad_clip``; the engine configs' ``fsdp_config.*`` role settings are the role's own keys; the nested
``model.lora.*`` are the flat LoRA keys; the checkpoint engine's bucket is the weight sync's)."""

GROUP_CHOICES: dict[str, dict[str, dict[str, str]]] = {
    "model_engine": {
        "dp": {}, "fsdp": {},
        "megatron": {f"{_A}.strategy": "megatron", "critic.strategy": "megatron"},
    },
}
"""verl's engine switch (a Hydra group choice in newer verl): ``model_engine=megatron`` selects the
megatron strategy for the actor (and its reference) and the critic; ``dp``/``fsdp`` keep the FSDP
strategies; any other value warns (:data:`VERL_ONLY` holds its default)."""

VERL_ONLY: dict[str, Any] = {
    'actor_rollout_ref.actor.optim.clip_grad': 1.0,
    'actor_rollout_ref.actor.optim.warmup_style': None,
    'actor_rollout_ref.actor.fsdp_config.use_orig_params': False,
    'actor_rollout_ref.actor.fsdp_config.seed': 42,
    'actor_rollout_ref.actor.fsdp_config.full_determinism': False,
    'actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size': 1,
    'actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking': False,
    'actor_rollout_ref.actor.fsdp_config.use_torch_compile': True,
    'actor_rollout_ref.actor.fsdp_config.entropy_checkpointing': False,
    'actor_rollout_ref.actor.fsdp_config.forward_only': False,
    'actor_rollout_ref.actor.fsdp_config.strategy': 'fsdp',
    'actor_rollout_ref.actor.fsdp_config.dtype': 'bfloat16',
    'actor_rollout_ref.actor.rollout_n': '${oc.select:actor_rollout_ref.rollout.n,1}',
    'actor_rollout_ref.actor.freeze_vision_tower': False,
    'actor_rollout_ref.actor.loss_scale_factor': None,
    'actor_rollout_ref.actor.calculate_entropy': False,
    'actor_rollout_ref.actor.data_loader_seed': 42,
    'actor_rollout_ref.actor.router_replay.mode': 'disabled',
    'actor_rollout_ref.actor.router_replay.record_file': None,
    'actor_rollout_ref.actor.router_replay.replay_file': None,
    'actor_rollout_ref.actor.sum_pi_squared_checkpointing': False,
    'actor_rollout_ref.ref.rollout_n': '${oc.select:actor_rollout_ref.rollout.n,1}',
    'actor_rollout_ref.ref.router_replay.mode': 'disabled',
    'actor_rollout_ref.ref.router_replay.record_file': None,
    'actor_rollout_ref.ref.router_replay.replay_file': None,
    'actor_rollout_ref.ref.fsdp_config.use_orig_params': False,
    'actor_rollout_ref.ref.fsdp_config.seed': 42,
    'actor_rollout_ref.ref.fsdp_config.full_determinism': False,
    'actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size': 1,
    'actor_rollout_ref.ref.fsdp_config.entropy_from_logits_with_chunking': False,
    'actor_rollout_ref.ref.fsdp_config.use_torch_compile': True,
    'actor_rollout_ref.ref.fsdp_config.entropy_checkpointing': False,
    'actor_rollout_ref.ref.fsdp_config.forward_only': True,
    'actor_rollout_ref.ref.fsdp_config.strategy': 'fsdp',
    'actor_rollout_ref.ref.fsdp_config.dtype': 'bfloat16',
    'actor_rollout_ref.rollout.data_parallel_size': 1,
    'actor_rollout_ref.rollout.expert_parallel_size': 1,
    'actor_rollout_ref.rollout.pipeline_model_parallel_size': 1,
    'actor_rollout_ref.rollout.logprobs_mode': 'processed_logprobs',
    'actor_rollout_ref.rollout.scheduling_policy': 'fcfs',
    'actor_rollout_ref.rollout.checkpoint_engine.backend': 'naive',
    'actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes': 2048,
    'actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs': {},
    'actor_rollout_ref.rollout.skip_tokenizer_init': True,
    'actor_rollout_ref.rollout.enable_rollout_routing_replay': False,
    'actor_rollout_ref.rollout.prometheus.enable': False,
    'actor_rollout_ref.rollout.prometheus.port': 9090,
    'actor_rollout_ref.rollout.prometheus.file': '/tmp/ray/session_latest/metrics/prometheus/prometheus.yml',
    'actor_rollout_ref.rollout.prometheus.served_model_name': '${oc.select:actor_rollout_ref.model.path,null}',
    'actor_rollout_ref.rollout.quantization': None,
    'actor_rollout_ref.rollout.quantization_config_file': None,
    'actor_rollout_ref.rollout.mtp': '${oc.select:actor_rollout_ref.model.mtp, null}',
    'actor_rollout_ref.model.hf_config_path': None,
    'actor_rollout_ref.model.tiled_mlp.enabled': False,
    'actor_rollout_ref.model.tiled_mlp.num_shards': 4,
    'actor_rollout_ref.model.mtp.enable': False,
    'actor_rollout_ref.model.mtp.enable_train': False,
    'actor_rollout_ref.model.mtp.enable_rollout': False,
    'actor_rollout_ref.model.mtp.detach_encoder': False,
    'actor_rollout_ref.model.mtp.mtp_loss_scaling_factor': 0.1,
    'actor_rollout_ref.model.mtp.speculative_algorithm': 'EAGLE',
    'actor_rollout_ref.model.mtp.speculative_num_steps': 2,
    'actor_rollout_ref.model.mtp.speculative_eagle_topk': 2,
    'actor_rollout_ref.model.mtp.speculative_num_draft_tokens': 4,
    'actor_rollout_ref.model.mtp.method': 'mtp',
    'actor_rollout_ref.model.mtp.num_speculative_tokens': 1,
    'data.image_patch_size': 14,
    'reward_manager.source': 'register',
    'reward_manager.name': '${oc.select:reward_model.reward_manager,naive}',
    'reward_manager.module.path': None,
    'reward_manager.module.name': 'custom_reward_manager',
    'critic.optim.clip_grad': 1.0,
    'critic.optim.warmup_style': None,
    'critic.model.fsdp_config.use_orig_params': False,
    'critic.model.fsdp_config.seed': 42,
    'critic.model.fsdp_config.full_determinism': False,
    'critic.model.fsdp_config.ulysses_sequence_parallel_size': 1,
    'critic.model.fsdp_config.entropy_from_logits_with_chunking': False,
    'critic.model.fsdp_config.use_torch_compile': True,
    'critic.model.fsdp_config.entropy_checkpointing': False,
    'critic.model.fsdp_config.forward_only': False,
    'critic.model.fsdp_config.strategy': 'fsdp',
    'critic.model.fsdp_config.dtype': 'bfloat16',
    'critic.model.tiled_mlp.enabled': False,
    'critic.model.tiled_mlp.num_shards': 4,
    'critic.data_loader_seed': 42,
    'reward_model.enable_resource_pool': False,
    'reward_model.n_gpus_per_node': 8,
    'reward_model.nnodes': 0,
    'reward_model.model.override_config': {},
    'reward_model.reward_loop_source': 'register',
    'reward_model.reward_loop_module_path': None,
    'reward_model.reward_loop_class_name': None,
    'reward_model.use_reward_loop': True,
    'reward_model.rollout.name': '???',
    'reward_model.rollout.dtype': 'bfloat16',
    'reward_model.rollout.gpu_memory_utilization': 0.5,
    'reward_model.rollout.enforce_eager': True,
    'reward_model.rollout.cudagraph_capture_sizes': None,
    'reward_model.rollout.free_cache_engine': True,
    'reward_model.rollout.data_parallel_size': 1,
    'reward_model.rollout.expert_parallel_size': 1,
    'reward_model.rollout.tensor_model_parallel_size': 2,
    'reward_model.rollout.max_num_batched_tokens': 8192,
    'reward_model.rollout.max_model_len': None,
    'reward_model.rollout.max_num_seqs': 1024,
    'reward_model.rollout.load_format': 'auto',
    'reward_model.rollout.engine_kwargs': {},
    'reward_model.rollout.limit_images': None,
    'reward_model.rollout.enable_chunked_prefill': True,
    'reward_model.rollout.enable_prefix_caching': True,
    'reward_model.rollout.disable_log_stats': True,
    'reward_model.rollout.skip_tokenizer_init': False,
    'reward_model.rollout.prompt_length': 2048,
    'reward_model.rollout.response_length': 2048,
    'transfer_queue.enable': False,
    'actor_rollout_ref.actor.optim.lr_warmup_init': 0.0,
    'actor_rollout_ref.actor.optim.lr_decay_steps': None,
    'actor_rollout_ref.actor.optim.lr_decay_style': 'constant',
    'actor_rollout_ref.actor.optim.min_lr': 0.0,
    'actor_rollout_ref.actor.optim.weight_decay_incr_style': 'constant',
    'actor_rollout_ref.actor.optim.lr_wsd_decay_style': 'exponential',
    'actor_rollout_ref.actor.optim.lr_wsd_decay_steps': None,
    'actor_rollout_ref.actor.optim.use_checkpoint_opt_param_scheduler': False,
    'actor_rollout_ref.actor.megatron.dist_checkpointing_prefix': '',
    'actor_rollout_ref.actor.megatron.override_mcore_model_config': {},
    'actor_rollout_ref.actor.megatron.vanilla_mbridge': True,
    'actor_rollout_ref.actor.megatron.use_remove_padding': True,
    'actor_rollout_ref.actor.megatron.forward_only': False,
    'actor_rollout_ref.actor.load_weight': True,
    'actor_rollout_ref.ref.megatron.dist_checkpointing_prefix': '',
    'actor_rollout_ref.ref.megatron.override_mcore_model_config': {},
    'actor_rollout_ref.ref.megatron.vanilla_mbridge': '${oc.select:actor_rollout_ref.actor.megatron.vanilla_mbridge,True}',
    'actor_rollout_ref.ref.megatron.use_remove_padding': '${oc.select:actor_rollout_ref.actor.megatron.use_remove_padding,True}',
    'actor_rollout_ref.ref.megatron.forward_only': True,
    'actor_rollout_ref.ref.load_weight': True,
    'actor_rollout_ref.rollout.layer_name_map.qkv_layer_name': 'qkv',
    'actor_rollout_ref.rollout.layer_name_map.gate_proj_layer_name': 'gate_up',
    'actor_rollout_ref.model.lora.type': 'lora',
    'actor_rollout_ref.model.lora.merge': False,
    'actor_rollout_ref.model.lora.rank': 0,
    'actor_rollout_ref.model.lora.alpha': 32,
    'actor_rollout_ref.model.lora.dropout': 0.0,
    'actor_rollout_ref.model.lora.target_modules': ['linear_qkv', 'linear_proj', 'linear_fc1', 'linear_fc2'],
    'actor_rollout_ref.model.lora.exclude_modules': [],
    'actor_rollout_ref.model.lora.dropout_position': 'pre',
    'actor_rollout_ref.model.lora.lora_A_init_method': 'xavier',
    'actor_rollout_ref.model.lora.lora_B_init_method': 'zero',
    'actor_rollout_ref.model.lora.a2a_experimental': False,
    'actor_rollout_ref.model.lora.dtype': None,
    'actor_rollout_ref.model.lora.adapter_path': None,
    'actor_rollout_ref.model.lora.freeze_vision_model': True,
    'actor_rollout_ref.model.lora.freeze_vision_projection': True,
    'actor_rollout_ref.model.lora.freeze_language_model': True,
    'critic.optim.lr_warmup_init': 0.0,
    'critic.optim.lr_decay_steps': None,
    'critic.optim.lr_decay_style': 'constant',
    'critic.optim.min_lr': 0.0,
    'critic.optim.weight_decay_incr_style': 'constant',
    'critic.optim.lr_wsd_decay_style': 'exponential',
    'critic.optim.lr_wsd_decay_steps': None,
    'critic.optim.use_checkpoint_opt_param_scheduler': False,
    'critic.megatron.dist_checkpointing_prefix': '',
    'critic.megatron.override_mcore_model_config': {},
    'critic.megatron.vanilla_mbridge': True,
    'critic.megatron.use_remove_padding': True,
    'critic.megatron.forward_only': False,
    'critic.model.lora.type': 'lora',
    'critic.model.lora.rank': 0,
    'critic.model.lora.alpha': 32,
    'critic.model.lora.dropout': 0.0,
    'critic.model.lora.target_modules': ['linear_qkv', 'linear_proj', 'linear_fc1', 'linear_fc2'],
    'critic.model.lora.exclude_modules': [],
    'critic.model.lora.dropout_position': 'pre',
    'critic.model.lora.lora_A_init_method': 'xavier',
    'critic.model.lora.lora_B_init_method': 'zero',
    'critic.model.lora.a2a_experimental': False,
    'critic.model.lora.dtype': None,
    'critic.model.lora.adapter_path': None,
    'critic.model.lora.freeze_vision_model': True,
    'critic.model.lora.freeze_vision_projection': True,
    'critic.model.lora.freeze_language_model': True,
    'critic.nccl_timeout': 600,
    'critic.load_weight': True,
    'reward_model.nccl_timeout': 600,
    'reward_model.megatron.param_offload': False,
    'reward_model.megatron.tensor_model_parallel_size': 1,
    'reward_model.megatron.expert_model_parallel_size': 1,
    'reward_model.megatron.expert_tensor_parallel_size': None,
    'reward_model.megatron.pipeline_model_parallel_size': 1,
    'reward_model.megatron.virtual_pipeline_model_parallel_size': None,
    'reward_model.megatron.context_parallel_size': 1,
    'reward_model.megatron.sequence_parallel': True,
    'reward_model.megatron.use_distributed_optimizer': False,
    'reward_model.megatron.use_dist_checkpointing': False,
    'reward_model.megatron.dist_checkpointing_path': None,
    'reward_model.megatron.dist_checkpointing_prefix': '',
    'reward_model.megatron.seed': '${oc.select:actor_rollout_ref.actor.megatron.seed,42}',
    'reward_model.megatron.override_transformer_config': '${oc.select:actor_rollout_ref.actor.megatron.override_transformer_config,{}}',
    'reward_model.megatron.use_mbridge': '${oc.select:actor_rollout_ref.actor.megatron.use_mbridge,False}',
    'reward_model.megatron.vanilla_mbridge': '${oc.select:actor_rollout_ref.actor.megatron.vanilla_mbridge,True}',
    'reward_model.megatron.use_remove_padding': '${oc.select:actor_rollout_ref.actor.megatron.use_remove_padding,True}',
    'reward_model.megatron.dtype': 'bfloat16',
    'reward_model.load_weight': True,
    "model_engine": "dp",
    "trainer.use_v1": False,
    # verl's fully-async and one-step-off trainers (verl/experimental/*/config/*_ppo_trainer.yaml, their defaults)
    "async_training.trigger_parameter_sync_step": 4,
    "async_training.require_batches": 1,
    "async_training.use_rollout_log_probs": True,
    "async_training.compute_prox_log_prob": False,
    "async_training.use_trainer_do_validate": False,
    "async_training.checkpoint_engine.enable": True,
    "async_training.checkpoint_engine.device_buffer_size_M": 4096,
    "async_training.checkpoint_engine.overlap_broadcast_and_consume": False,
    "rollout.nnodes": 1,
    "rollout.n_gpus_per_node": 8,
    "rollout.n": 4,
    "rollout.total_rollout_steps": 100,
    "rollout.total_epochs": 10,
    "rollout.test_freq": 1,
    f"{_A}.use_rollout_log_probs": "${oc.select:async_training.use_rollout_log_probs, True}",
    "actor_rollout_ref.checkpoint_engine": "${oc.select:async_training.checkpoint_engine, null}",
    # set by verl's example scripts and example YAML files, outside the generated configs
    "actor_rollout_ref.model.torch_dtype": None,
    "critic.model.torch_dtype": None,
    f"{_O}.sglang_rollout_mode": None,
}
VERL_ONLY = {k: v for k, v in VERL_ONLY.items() if k not in ALIASES and not k.endswith(".optim.warmup_style")}
"""Every verl leaf key rlforge neither types nor aliases (``optim.warmup_style`` is an alias of the loader's
``KEY_ALIASES``), with verl's default (a value equal to it, or to
its ``${...}`` text, is silent)."""

OPEN_PREFIXES: tuple[str, ...] = (
    "distillation.", "trainer.v1.", f"{_A}.veomni.", f"{_R}.veomni.", "critic.veomni.", "critic.model.veomni.",
    f"{_O}.checkpoint_engine.engine_kwargs.", f"{_O}.server.",
)
"""Blocks of newer verl whose every sub-key is accepted; a value that is not null/empty/false warns."""

_NO_SERVER = "a vLLM/SGLang server setting; the native and hf rollouts generate in the training process"
_MEGATRON_LM = "a Megatron-LM setting; strategy=megatron is PyTorch tensor/pipeline parallelism with FSDP2"
_RM = "the reward model runs as one forward-only module per process (reward_model.model.*)"
_MM = "multi-modal data is not supported in this build"

_SPLIT = ("verl's fully-async / one-step-off trainers run the rollout on GPUs of its own; rlforge trains "
          "colocated on every GPU (async_training.partial_rollout=true continues the long tail after the update)")

_BYPASS = ("the update's old log-probs are the trainer's own, recomputed, unless "
           "algorithm.rollout_correction.bypass_mode=true takes the rollout's (verl's switch for the same)")

REASONS: tuple[tuple[str, str], ...] = (
    ("rollout.*", _SPLIT + "; the rollout's GPUs are trainer.nnodes x trainer.n_gpus_per_node and its "
     "responses per prompt actor_rollout_ref.rollout.n"),
    ("async_training.use_rollout_log_probs", _BYPASS),
    (f"{_A}.use_rollout_log_probs", _BYPASS),
    ("async_training.*", _SPLIT),
    ("actor_rollout_ref.checkpoint_engine", _SPLIT),
    ("*.router_replay.*", "MoE router replay is not available in this build"),
    ("*.enable_rollout_routing_replay", "MoE router replay is not available in this build"),
    ("*.fsdp_config.use_orig_params", "rlforge's FSDP1 always runs with use_orig_params=True (FSDP2 keeps "
     "parameter names anyway); nothing changes"),
    ("*.fsdp_config.seed", "the model build and sampling are seeded from data.seed"),
    ("*.fsdp_config.full_determinism", "deterministic kernels are not forced in this build"),
    ("*.forward_only", "verl sets it per role; rlforge's reference is forward-only already"),
    ("*.fsdp_config.strategy", "the engine is the role's strategy key (actor_rollout_ref.actor.strategy, "
     "critic.strategy)"),
    ("*.model.torch_dtype", "the master dtype is fsdp_config.model_dtype and the compute dtype "
     "fsdp_config.mixed_precision.param_dtype"),
    ("*.fsdp_config.dtype", "the master dtype is fsdp_config.model_dtype and the compute dtype "
     "fsdp_config.mixed_precision.param_dtype"),
    ("*.rollout_n", "the responses per prompt are actor_rollout_ref.rollout.n"),
    ("*.freeze_vision_tower", _MM), ("*.freeze_vision_*", _MM), ("data.image_patch_size", _MM),
    ("*.limit_images", _MM),
    ("*.loss_scale_factor", "the loss is normalized by actor.loss_agg_mode over the global token/sequence "
     "counts, as verl does by default"),
    ("*.calculate_entropy", "the entropy is computed when actor.entropy_coeff is not 0 and for the "
     "actor/entropy metric"),
    ("*.data_loader_seed", "the training set is shuffled with data.seed"),
    ("*.sum_pi_squared_checkpointing", "the sum of squared probabilities is computed chunk by chunk "
     "already"),
    (f"{_O}.data_parallel_size", "the rollout runs one model copy per GPU (no rollout data parallelism); using 1"),
    (f"{_O}.expert_parallel_size", "expert-parallel rollout is not available; using 1 (one model copy per GPU)"),
    (f"{_O}.pipeline_model_parallel_size", "pipeline-parallel rollout is not available; using 1"),
    (f"{_O}.checkpoint_engine.*", "the weights reach the rollout in the training process (no checkpoint "
     "engine); only update_weights_bucket_megabytes maps (rollout.update_weights_bucket_megabytes)"),
    (f"{_O}.*", _NO_SERVER),
    ("*.model.hf_config_path", "the model config is read from model.path"),
    ("*.tiled_mlp.*", "tiled MLP is not implemented; activation checkpointing "
     "(model.enable_gradient_checkpointing) bounds the memory instead"),
    ("*.model.mtp.*", "multi-token prediction is not available in this build"),
    ("reward_manager.*", "reward_model.reward_manager picks rlforge's reward manager; a user class is not "
     "loaded (custom_reward_function.path takes a scoring function)"),
    ("*.optim.*", "a Megatron optimizer-schedule setting; rlforge's schedule is optim.lr_scheduler_type, "
     "lr_warmup_steps(_ratio), min_lr_ratio"),
    ("reward_model.*", _RM),
    ("*.megatron.*", _MEGATRON_LM),
    ("*.load_weight", "weights always load from model.path"),
    ("*.nccl_timeout", "one process group per run, whose timeout is actor_rollout_ref.nccl_timeout"),
    ("*.lora.*", "rlforge's LoRA (model.lora_rank, lora_alpha, target_modules, exclude_modules) has no such "
     "option; standard LoRA on the linear layers"),
    ("transfer_queue.*", "verl's TransferQueue data plane; rlforge passes batches in the training process"),
    ("distillation.*", "on-policy distillation is not available in this build"),
    ("trainer.use_v1", "verl's v1 trainer; rlforge has one trainer (rlforge train)"),
    ("trainer.v1.*", "verl's v1 trainer; rlforge has one trainer (rlforge train)"),
    ("*.veomni.*", "the VeOmni engine is not available; strategy fsdp, fsdp2 or megatron"),
    ("model_engine", "verl's engine switch: dp/fsdp (FSDP strategies) and megatron map onto the strategy keys; "
     "this engine is not available, the roles' strategy keys decide"),
)
"""``(fnmatch pattern, reason)``: the first pattern that matches a verl-only key gives its warning."""


@dataclass(frozen=True)
class KeyTable:
    """One entry point's verl key tables (the PPO trainer's: :data:`PPO`; the SFT trainer's:
    :data:`rlforge.config.verl_sft_keys.SFT`), applied by the loader."""

    aliases: Mapping[str, str]
    """verl key -> rlforge key (the value is set on rlforge's key)."""
    verl_only: Mapping[str, Any]
    """verl key -> verl's default: accepted, a value other than the default warns."""
    open_prefixes: tuple[str, ...]
    """Blocks whose every sub-key is accepted; a value that is not null/empty/false warns."""
    reasons: tuple[tuple[str, str], ...]
    """``(fnmatch pattern, reason)``: the first match gives a verl-only key's warning."""
    group_choices: Mapping[str, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)
    """Hydra group choices (``key=choice``): the rlforge settings each known choice makes."""

    def alias_of(self, dotted: str) -> str | None:
        """rlforge's key for the verl key ``dotted``; None when it is not an alias."""
        return self.aliases.get(dotted)

    def is_verl_only(self, dotted: str) -> bool:
        """Whether ``dotted`` is a verl leaf key that rlforge accepts and warns about."""
        return dotted in self.verl_only or dotted.startswith(self.open_prefixes)

    def is_verl_node(self, dotted: str) -> bool:
        """Whether ``dotted`` is a block above verl-only keys or aliases (a YAML file may give it as a mapping)."""
        head = dotted + "."
        return (any(k.startswith(head) for k in (*self.open_prefixes, *self.verl_only, *self.aliases))
                or dotted.startswith(self.open_prefixes))

    def reason(self, dotted: str) -> str:
        """Why the verl-only key ``dotted`` changes nothing here, and what rlforge does instead."""
        for pattern, why in self.reasons:
            if fnmatch.fnmatchcase(dotted, pattern):
                return why
        return "a verl setting rlforge has no counterpart for"

    def matters(self, dotted: str, value: Any) -> bool:
        """Whether ``value`` of the verl-only key ``dotted`` differs from verl's default (worth a warning)."""
        if dotted in self.verl_only:
            default = self.verl_only[dotted]
            return not (value == default or (isinstance(value, list | tuple) and list(value) == default))
        return value not in (None, False, "", {}, [])

    def warnings(self, values: Mapping[str, Any]) -> list[str]:
        """One line per verl-only key in ``values`` (dotted key -> the user's value) whose value matters."""
        return [f"{k}={v}: {self.reason(k)}; ignored" for k, v in sorted(values.items()) if self.matters(k, v)]


PPO = KeyTable(ALIASES, VERL_ONLY, OPEN_PREFIXES, REASONS, GROUP_CHOICES)
"""The PPO trainer's tables (``rlforge train``, ``python -m rlforge.trainer.main_ppo``)."""


def alias_of(dotted: str) -> str | None:
    """rlforge's key for the verl key ``dotted`` (:data:`PPO`); None when it is not an alias."""
    return PPO.alias_of(dotted)


def is_verl_only(dotted: str) -> bool:
    """Whether ``dotted`` is a verl leaf key of the PPO config that rlforge accepts and warns about."""
    return PPO.is_verl_only(dotted)


def is_verl_node(dotted: str) -> bool:
    """Whether ``dotted`` is a block above the PPO config's verl-only keys or aliases."""
    return PPO.is_verl_node(dotted)


def reason(dotted: str) -> str:
    """Why the PPO config's verl-only key ``dotted`` changes nothing here, and what rlforge does instead."""
    return PPO.reason(dotted)


def matters(dotted: str, value: Any) -> bool:
    """Whether ``value`` of the PPO config's verl-only key ``dotted`` differs from verl's default."""
    return PPO.matters(dotted, value)


def verl_only_warnings(values: dict[str, Any]) -> list[str]:
    """One line per verl-only key of the PPO config in ``values`` whose value matters."""
    return PPO.warnings(values)

"""verl's SFT keys that the SFT schema (:mod:`rlforge.config.sft`) does not type: aliases onto its keys
and verl-only keys accepted with a warning (data, not code; :func:`rlforge.config.sft.load_sft_config`
applies them through the loader, as :mod:`rlforge.config.verl_keys` does for the PPO trainer).

Pinned to verl :data:`rlforge.config.verl_keys.VERL_PIN`: every leaf key of ``verl/trainer/config/sft_trainer.yaml``
(``fsdp_sft_trainer.py``, its ``optim: fsdp`` group resolved) and of ``sft_trainer_engine.yaml``
(``sft_trainer.py``, its groups ``model: hf_model``, ``engine: fsdp``, ``optim: fsdp``,
``profiler: profiler`` resolved) is typed in the SFT schema (it takes effect), an alias here
(:data:`SFT_ALIASES`), or verl-only here (:data:`SFT_VERL_ONLY`, with verl's default; another value
warns with the reason of :data:`SFT_REASONS`).  ``tests/config/test_verl_sft_schema.py`` checks both files.
The older aliases of single keys (``model.partial_pretrain``, ``optim.lr_scheduler``,
``optim.warmup_style``, ``optim.warmup_steps_ratio``) are :data:`rlforge.config.sft.SFT_KEY_ALIASES`.
"""

from __future__ import annotations

from typing import Any

from rlforge.config.verl_keys import KeyTable

SFT_ALIASES: dict[str, str] = {
    "data.multiturn.messages_key": "data.messages_key",
    "data.multiturn.tools_key": "data.tools_key",
    "data.multiturn.enable_thinking_key": "data.enable_thinking_key",
    "use_remove_padding": "model.use_remove_padding",
    "engine.strategy": "model.strategy",
    "engine.dtype": "engine.mixed_precision.param_dtype",
    "model.fsdp_config.model_dtype": "engine.model_dtype",
    "model.fsdp_config.wrap_policy.min_num_params": "engine.wrap_policy.min_num_params",
    "model.fsdp_config.cpu_offload": "engine.offload_policy",
}
"""verl SFT key -> rlforge SFT key.  The older trainer's ``model.fsdp_config`` is the newer one's ``engine``
block (``cpu_offload`` is FSDP's CPU offload, rlforge's ``offload_policy``); ``engine.strategy`` picks FSDP1
or FSDP2 (rlforge's ``model.strategy``); ``engine.dtype`` is the mixed-precision compute dtype; the older
top-level ``use_remove_padding`` is ``model.use_remove_padding``."""

_PROFILER: dict[str, Any] = {
    "profiler.tool": "torch", "profiler.enable": False, "profiler.all_ranks": False, "profiler.ranks": [],
    "profiler.save_path": "outputs/profile",
    "profiler.tool_config.npu.contents": [], "profiler.tool_config.npu.level": "level0",
    "profiler.tool_config.npu.analysis": True, "profiler.tool_config.npu.discrete": False,
    "profiler.tool_config.npu.name": "npu",
    "profiler.tool_config.nsys.discrete": "${oc.select:global_profiler.global_tool_config.nsys.discrete}",
    "profiler.tool_config.nsys.name": "nsight",
    "profiler.tool_config.torch.contents": [], "profiler.tool_config.torch.discrete": False,
    "profiler.tool_config.torch.name": "torch",
    "profiler.tool_config.torch_memory.trace_alloc_max_entries":
        "${oc.select:global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries,100000}",
    "profiler.tool_config.torch_memory.stack_depth":
        "${oc.select:global_profiler.global_tool_config.torch_memory.stack_depth,32}",
    "profiler.tool_config.torch_memory.name": "torch_memory",
}

_MTP: dict[str, Any] = {
    "enable": False, "enable_train": False, "enable_rollout": False, "detach_encoder": False,
    "mtp_loss_scaling_factor": 0.1, "speculative_algorithm": "EAGLE", "speculative_num_steps": 2,
    "speculative_eagle_topk": 2, "speculative_num_draft_tokens": 4, "method": "mtp", "num_speculative_tokens": 1,
}

SFT_VERL_ONLY: dict[str, Any] = {
    # the group choices of sft_trainer_engine.yaml (engine=fsdp, optim=fsdp, ...) other than rlforge's
    "engine": "fsdp", "optim": "fsdp", "model": "hf_model", "profiler": "profiler",
    "data.micro_batch_size": None,
    "data.prompt_dict_keys": None,
    "data.response_dict_keys": None,
    "data.multiturn.enable": False,
    "data.pad_mode": "no_padding",
    "data.balance_dp_token": False,
    "data.chat_template": None,
    "data.custom_cls.path": None,
    "data.custom_cls.name": None,
    "data.use_shm": False,
    "data.ignore_input_ids_mismatch": False,
    "model.use_shm": False,
    "model.fsdp_config.offload_params": False,
    "model.external_lib": None,
    "model.trust_remote_code": False,
    "model.use_liger": False,
    "model.hf_config_path": None,
    "model.custom_chat_template": None,
    "model.use_fused_kernels": False,
    "model.fused_kernel_options.impl_backend": "torch",
    "model.tiled_mlp.enabled": False,
    "model.tiled_mlp.num_shards": 4,
    **{f"model.mtp.{k}": v for k, v in _MTP.items()},
    "ulysses_sequence_parallel_size": 1,
    "engine.use_orig_params": False,
    "engine.seed": 42,
    "engine.full_determinism": False,
    "engine.ulysses_sequence_parallel_size": 1,
    "engine.entropy_from_logits_with_chunking": False,
    "engine.use_torch_compile": True,
    "engine.entropy_checkpointing": False,
    "engine.forward_only": False,
    "optim.optimizer": "AdamW",
    "optim.optimizer_impl": "torch.optim",
    "optim.total_training_steps": -1,
    "optim.override_optimizer_config": None,
    "checkpoint.save_contents": ["model", "optimizer", "extra"],
    "checkpoint.load_contents": "${checkpoint.save_contents}",
    "trainer.checkpoint.save_contents": ["model", "optimizer", "extra"],
    "trainer.checkpoint.load_contents": "${trainer.checkpoint.save_contents}",
    "trainer.default_hdfs_dir": None,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 1,
    "trainer.profile_interval": [-1, -1],
    **_PROFILER,
}
"""Every verl SFT leaf key that the SFT schema neither types nor aliases, with verl's default (a value equal
to it, or to its ``${...}`` text, is silent).  ``trainer.n_gpus_per_node`` has the newer trainer's default (1;
the older one's is 8)."""

_ONE_GPU_GROUP = "the ranks are the launcher's (torchrun --nnodes/--nproc_per_node, or one process)"
_NO_SP = ("Ulysses sequence parallelism is not available in the SFT trainer (each rank holds whole samples; "
          "data.max_token_len_per_gpu bounds a micro-batch)")
_CKPT = ("each global_step_N/ holds the model (or the LoRA adapter), the optimizer and the schedule, the RNG and "
         "the step, and huggingface/ (the model for rlforge train); a resume loads all of them")

SFT_REASONS: tuple[tuple[str, str], ...] = (
    ("engine", "verl's engine group: rlforge's SFT trainer runs FSDP (model.strategy fsdp2 or fsdp); the engine.* "
     "keys are FSDP's"),
    ("optim", "verl's optimizer group: rlforge's SFT optimizer is AdamW (optim.*)"),
    ("model", "verl's model group: the model is model.path (a Hugging Face model)"),
    ("profiler", "verl's profiler group: the SFT trainer runs without a profiler"),
    ("profiler.*", "the SFT trainer runs without a profiler (rlforge train has perf.* and global_profiler)"),
    ("trainer.profile_interval", "the SFT trainer runs without a profiler"),
    ("data.micro_batch_size", "deprecated in verl and not read by its SFT trainers; the micro-batch is "
     "data.micro_batch_size_per_gpu (or data.max_token_len_per_gpu with data.use_dynamic_bsz)"),
    ("data.*_dict_keys", "prompt_key/response_key columns are read as strings (nested dict columns are not "
     "looked into); give flat columns or multi-turn rows (data.messages_key)"),
    ("data.multiturn.enable", "a row is multi-turn when it has data.messages_key, single-turn otherwise; "
     "no switch is needed"),
    ("data.pad_mode", "the padding-free forward is model.use_remove_padding (true packs the micro-batch, false "
     "pads it on the right)"),
    ("data.balance_dp_token", "each rank gets data.train_batch_size / ranks samples; the loss is normalized by "
     "the global token count already"),
    ("data.chat_template", "verl refuses it too; the chat template is the tokenizer's (model.tokenizer_path)"),
    ("data.custom_cls.*", "a user dataset class is not loaded; rows are read from parquet/jsonl/json "
     "(data.messages_key or data.prompt_key/response_key)"),
    ("*.use_shm", "the files are read from their path; no copy to shared memory"),
    ("data.ignore_input_ids_mismatch", "rlforge renders each chat whole (no per-turn concatenation to mismatch); "
     "a template that rewrites earlier turns is refused, naming the row"),
    ("model.fsdp_config.offload_params", "model.fsdp_config.cpu_offload (engine.offload_policy) offloads "
     "parameters, gradients and the optimizer step together"),
    ("model.external_lib", "no module is imported for the model; Hugging Face models load from model.path"),
    ("model.trust_remote_code", "remote model code is not run; architectures that transformers has load"),
    ("model.use_liger", "Liger kernels are not used; the padding-free forward (model.use_remove_padding) and "
     "token-budget micro-batches save the memory"),
    ("model.hf_config_path", "the model config is read from model.path"),
    ("model.custom_chat_template", "the chat template is the tokenizer's (model.tokenizer_path)"),
    ("model.use_fused_kernels", "the SFT loss takes the log-probs of the model's logits"),
    ("model.fused_kernel_options.*", "the SFT loss takes the log-probs of the model's logits"),
    ("model.tiled_mlp.*", "tiled MLP is not implemented; model.enable_gradient_checkpointing bounds the memory"),
    ("model.mtp.*", "multi-token prediction is not available in this build"),
    ("*ulysses_sequence_parallel_size", _NO_SP),
    ("engine.use_orig_params", "rlforge's FSDP1 always runs with use_orig_params=True (FSDP2 keeps parameter "
     "names anyway); nothing changes"),
    ("engine.seed", "the model build, the LoRA adapter and the data order are seeded from trainer.seed"),
    ("engine.full_determinism", "deterministic kernels are not forced in this build"),
    ("engine.entropy_*", "the SFT trainer computes no entropy"),
    ("engine.use_torch_compile", "the SFT model runs eagerly"),
    ("engine.forward_only", "the SFT model is trained"),
    ("optim.optimizer", "the optimizer is torch's AdamW"),
    ("optim.optimizer_impl", "the optimizer is torch's AdamW"),
    ("optim.total_training_steps", "verl's trainer fills it in; the schedule's length is trainer.total_training_steps "
     "(or trainer.total_epochs x the steps per epoch)"),
    ("optim.override_optimizer_config", "AdamW takes optim.lr, betas and weight_decay only"),
    ("*checkpoint.*_contents", _CKPT),
    ("trainer.default_hdfs_dir", "checkpoints are written to trainer.default_local_dir only"),
    ("trainer.nnodes", _ONE_GPU_GROUP),
    ("trainer.n_gpus_per_node", _ONE_GPU_GROUP),
)
"""``(fnmatch pattern, reason)``: the first pattern that matches an SFT verl-only key gives its warning."""

SFT_GROUP_CHOICES: dict[str, dict[str, dict[str, Any]]] = {
    "engine": {"fsdp": {}}, "optim": {"fsdp": {}}, "model": {"hf_model": {}}, "profiler": {"profiler": {}},
}
"""verl's SFT group choices (``engine=fsdp optim=fsdp`` in its example scripts): those rlforge's SFT schema is
are accepted silently; another (``engine=megatron``, ``engine=veomni``) warns (:data:`SFT_VERL_ONLY`)."""

SFT = KeyTable(SFT_ALIASES, SFT_VERL_ONLY, (), SFT_REASONS, SFT_GROUP_CHOICES)
"""The SFT trainer's verl key tables."""

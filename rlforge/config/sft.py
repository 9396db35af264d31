"""Config of the SFT trainer (``python -m rlforge.trainer.sft_trainer``, ``rlforge sft``).

Key names follow verl's SFT trainer (``verl/trainer/config/sft_trainer_engine.yaml`` at verl
``1dda039``, and the older ``sft_trainer.yaml`` of ``fsdp_sft_trainer.py``): ``data.*``, ``model.*``,
``optim.*``, ``trainer.*``.  Older spellings are accepted as aliases: ``model.partial_pretrain`` =
``model.path``; ``optim.lr_scheduler`` and ``optim.warmup_style`` = ``optim.lr_scheduler_type``;
``optim.warmup_steps_ratio`` = ``optim.lr_warmup_steps_ratio``.  ``engine.*`` is the FSDP block of verl's
``engine: fsdp`` group (rlforge's :class:`~rlforge.config.common.FSDPConfig`, as a PPO role's ``fsdp_config``).
Every key here takes effect (:mod:`rlforge.trainer.sft_trainer`).  verl's other SFT keys (both of its
SFT trainers') map onto these or are accepted with a warning (:mod:`rlforge.config.verl_sft_keys`); any
other key is refused with the closest valid key, as ``rlforge train`` does.  Torch-free: loading and
checking the config imports no torch.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rlforge.config.actor import DEFAULT_MODEL
from rlforge.config.common import FSDPConfig
from rlforge.config.data import BuiltinTaskConfig
from rlforge.config.ranges import SFT_RANGES, check_device, check_ranges
from rlforge.config.sft_engine_check import check_sft_engine
from rlforge.errors import ConfigError, RLForgeWarning

TRUNCATION = ("error", "left", "right")
RESUME_MODES = ("auto", "disable", "resume_path")
STRATEGIES = ("fsdp2", "fsdp")
SCHEDULES = ("constant", "cosine")


@dataclass
class SFTDataConfig:
    """SFT data: multi-turn chats (``messages_key``) or prompt/response pairs."""

    train_files: Any = "builtin:arithmetic"
    """Parquet/jsonl/json file(s), or ``builtin:arithmetic`` (the built-in task's questions with their
    answers as the assistant turn).  verl's default (``~/data/gsm8k/train.parquet``) is replaced by the
    built-in task so that the defaults run anywhere."""
    val_files: Any = None
    """Validation file(s); None = no validation."""
    train_max_samples: int = -1
    """Rows used from the training files (the first ones); -1 = all."""
    val_max_samples: int = -1
    """Rows used from the validation files; -1 = all."""
    messages_key: str = "messages"
    """Column of a row's chat (list of ``{role, content}``); a row that has it is a multi-turn sample, trained on
    its assistant turns only."""
    prompt_key: str = "question"
    """Column of the prompt (a string, rendered as one user turn), for rows without ``messages_key``."""
    response_key: str = "answer"
    """Column of the response (a string, rendered as the assistant turn), for rows without ``messages_key``."""
    max_length: int = 1024
    """Longest sample in tokens (the whole rendered chat); longer ones follow ``truncation``."""
    truncation: str = "error"
    """Over-long sample: ``error`` (one error naming the row), ``left`` (keep the end), ``right`` (keep the start)."""
    train_batch_size: int = 256
    """Samples per optimizer step, over all ranks (divisible by the number of ranks)."""
    micro_batch_size_per_gpu: int = 4
    """Samples per forward/backward on one rank (also the validation batch); unused with ``use_dynamic_bsz``."""
    use_dynamic_bsz: bool = True
    """Form micro-batches by token budget (``max_token_len_per_gpu``) instead of ``micro_batch_size_per_gpu``."""
    max_token_len_per_gpu: int = 8192
    """Token budget of one micro-batch with ``use_dynamic_bsz``; >= ``max_length``."""
    tools_key: str = "tools"
    """Column of a row's tool schemas (a list of objects, or its JSON text), passed as ``tools=`` to the chat
    template for that row; a missing column or null value = no tools.  Alias ``multiturn.tools_key``."""
    enable_thinking_key: str = "enable_thinking"
    """Column of a row's ``enable_thinking`` (true/false), passed to the chat template for that row over
    ``apply_chat_template_kwargs``; a missing column or null value = the config's.  Alias
    ``multiturn.enable_thinking_key``."""
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra keywords for ``tokenizer.apply_chat_template`` (e.g. ``{enable_thinking: false}``)."""
    builtin: BuiltinTaskConfig = field(default_factory=BuiltinTaskConfig)
    """rlforge addition: size and difficulty of ``builtin:`` tasks (as ``rlforge train``'s ``data.builtin``)."""


@dataclass
class SFTModelConfig:
    """The model trained (full fine-tuning, or a LoRA adapter with ``lora_rank`` > 0)."""

    path: str = DEFAULT_MODEL
    """HF folder, Hub id, GGUF file or ``preset:NAME`` (as ``actor_rollout_ref.model.path``).  Alias:
    ``partial_pretrain`` (older verl)."""
    tokenizer_path: str | None = None
    """Tokenizer (with its chat template); None = the model's."""
    override_config: dict[str, Any] = field(default_factory=dict)
    """Entries set on the model's HF config before it is built (e.g. ``attn_implementation``)."""
    enable_gradient_checkpointing: bool = True
    """Recompute each decoder layer's activations in backward."""
    enable_activation_offload: bool = False
    """Keep the checkpointed activations in host memory until backward (as ``rlforge train``'s
    ``actor_rollout_ref.model.enable_activation_offload``)."""
    use_remove_padding: bool = True
    """Padding-free forward: the micro-batch's samples packed into one row."""
    lora_rank: int = 0
    """LoRA rank; 0 = full fine-tuning."""
    lora_alpha: int = 16
    """LoRA scaling numerator (scale = alpha / rank)."""
    target_modules: Any = "all-linear"
    """Modules given a LoRA adapter: ``all-linear``, a list of names, or one regex."""
    exclude_modules: Any = None
    """Modules excluded from LoRA; None = none."""
    lora_adapter_path: str | None = None
    """A peft adapter folder to go on training (its ``adapter_config.json`` sets the rank, alpha and targets;
    LoRA is on even with ``lora_rank=0``); None = a new adapter when ``lora_rank`` > 0."""
    strategy: str = "fsdp2"
    """Training engine: ``fsdp2`` or ``fsdp`` (FSDP1); one code path for 1..N ranks (older verl's key; the
    newer trainer's is ``engine.strategy``, an alias)."""


@dataclass
class SFTOptimConfig:
    """AdamW and the learning-rate schedule, stepped once per optimizer step (older verl's SFT defaults)."""

    lr: float = 1e-5
    """Peak learning rate."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW betas."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    lr_warmup_steps: int = -1
    """Linear-warmup steps; -1 = ``lr_warmup_steps_ratio`` x the total steps."""
    lr_warmup_steps_ratio: float = 0.1
    """Warmup as a fraction of the total steps (when ``lr_warmup_steps`` is -1).  Alias ``warmup_steps_ratio``."""
    lr_scheduler_type: str = "cosine"
    """``cosine`` (to ``min_lr_ratio`` x lr) or ``constant`` after warmup.  Aliases ``lr_scheduler``, ``warmup_style``."""
    min_lr_ratio: float = 0.0
    """Final learning rate of the cosine schedule, as a fraction of ``lr``."""
    num_cycles: float = 0.5
    """Cosine cycles over the run (0.5 = one half-cosine down)."""
    clip_grad: float = 1.0
    """Max global gradient norm; <= 0 = no clipping."""


@dataclass
class SFTTrainerConfig:
    """The run: length, checkpoints, logging."""

    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """Output folder: ``global_step_N/`` checkpoints, each with ``huggingface/`` (the model for
    ``rlforge train actor_rollout_ref.model.path=...``)."""
    project_name: str = "gsm8k-sft"
    """Project name for the loggers."""
    experiment_name: str = "test"
    """Experiment name for the loggers."""
    total_epochs: int = 4
    """Passes over the training data (when ``total_training_steps`` is None)."""
    total_training_steps: int | None = None
    """Optimizer steps; None = ``total_epochs`` x steps per epoch."""
    save_freq: int = -1
    """Save a checkpoint every N steps; the last step is always saved.  -1 = only the last."""
    test_freq: int = -1
    """Validate every N steps (with ``data.val_files``); the last step always validates.  -1 = only the last."""
    max_ckpt_to_keep: int | None = None
    """Keep the newest N checkpoints; None = all."""
    logger: list[str] = field(default_factory=lambda: ["console"])
    """Metric loggers: console, file, tensorboard, wandb, mlflow."""
    seed: int = 1
    """Seed of the data order, of a preset's weights and of a LoRA adapter's initialisation."""
    device: str = "auto"
    """``auto`` (CUDA when available), ``cuda`` or ``cpu``."""
    resume_mode: str = "auto"
    """``auto``: resume from ``resume_from_path`` when set, else from the latest checkpoint in
    ``default_local_dir`` if any | ``disable``: start from ``model.path`` | ``resume_path``: resume from
    ``resume_from_path``.  A resume restores the model (or adapter), optimizer, schedule, RNG and the
    data position, so the steps after it are those of an uninterrupted run (verl's SFT trainer)."""
    resume_from_path: str | None = None
    """A ``global_step_N`` checkpoint folder to resume from (``resume_mode`` ``resume_path`` or ``auto``)."""


@dataclass
class SFTConfig:
    """Root of the SFT trainer's config."""

    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    engine: FSDPConfig = field(default_factory=FSDPConfig)
    """FSDP sharding, offload and dtypes of the trained model (verl's ``engine`` block; older verl's
    ``model.fsdp_config``): ``param_offload`` keeps the weights on the CPU between steps,
    ``offload_policy`` is FSDP's own CPU offload, as for ``rlforge train``'s ``fsdp_config``."""
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)


SFT_KEY_ALIASES: dict[type, dict[str, str]] = {
    SFTModelConfig: {"partial_pretrain": "path"},
    SFTOptimConfig: {"lr_scheduler": "lr_scheduler_type", "warmup_style": "lr_scheduler_type",
                     "warmup_steps_ratio": "lr_warmup_steps_ratio"},
}
"""Older verl spellings of the SFT keys: ``{dataclass: {old_name: current_name}}``."""


def load_sft_config(overrides: Sequence[str] = (), config_file: str | None = None) -> SFTConfig:
    """The SFT config: defaults <- ``config_file`` <- ``overrides`` (``key=value``, as ``rlforge train``),
    checked by :func:`validate_sft_config`.

    Raises:
        ConfigError: unknown key (naming the closest valid one), wrong type, or a refused value.
    """
    from rlforge.config.loader import KEY_ALIASES, load_schema
    from rlforge.config.verl_sft_keys import SFT

    for cls, aliases in SFT_KEY_ALIASES.items():
        KEY_ALIASES.setdefault(cls, dict(aliases))
    cfg = load_schema(SFTConfig, overrides, config_file, verl_table=SFT)
    for line in validate_sft_config(cfg):
        warnings.warn(line, RLForgeWarning, stacklevel=2)
    return cfg


def _check_choice(key: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}={value!r}: expected one of {', '.join(choices)}")


def _check_positive(key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{key}={value}: must be > 0")


def check_micro_batch(d: SFTDataConfig, world: int) -> None:
    """Without ``data.use_dynamic_bsz``, ``data.micro_batch_size_per_gpu`` must not exceed a rank's share of
    ``data.train_batch_size`` (``world`` ranks).  verl refuses it too: ``fsdp_sft_trainer.py`` asserts that
    a rank's batch is a multiple of the micro-batch, and ``sft_trainer.py``'s engine would split the batch
    into zero micro-batches; here it would silently train on one smaller micro-batch.

    Raises:
        ConfigError: naming both keys and the numbers.
    """
    per, micro = int(d.train_batch_size) // max(world, 1), int(d.micro_batch_size_per_gpu)
    if d.use_dynamic_bsz or micro <= per:
        return
    share = f"data.train_batch_size={d.train_batch_size}" + (f" over {world} ranks = {per} per rank" if world > 1 else "")
    raise ConfigError(f"data.micro_batch_size_per_gpu={micro} is larger than the batch ({share}) with "
                      "data.use_dynamic_bsz=false; lower data.micro_batch_size_per_gpu or raise data.train_batch_size")


def validate_sft_config(cfg: SFTConfig) -> list[str]:
    """Cross-field checks of the SFT config (values only; the world size is checked at start).
    Returns the warnings: verl loggers rlforge skips, verl's keys that change nothing here
    (:mod:`rlforge.config.verl_sft_keys`), engine settings that do not apply.

    Raises:
        ConfigError: naming the key and the fix.
    """
    d, m, o, t = cfg.data, cfg.model, cfg.optim, cfg.trainer
    check_ranges(cfg, SFT_RANGES)  # every float finite; the optimizer's keys in range, as the RL actor's
    check_device(t.device)
    _check_choice("data.truncation", d.truncation, TRUNCATION)
    _check_choice("model.strategy", m.strategy, STRATEGIES)
    _check_choice("optim.lr_scheduler_type", o.lr_scheduler_type, SCHEDULES)
    _check_choice("trainer.resume_mode", t.resume_mode, RESUME_MODES)
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<a global_step_N folder>")
    for key, value in (("data.max_length", d.max_length), ("data.train_batch_size", d.train_batch_size),
                       ("data.micro_batch_size_per_gpu", d.micro_batch_size_per_gpu), ("optim.lr", o.lr),
                       ("data.max_token_len_per_gpu", d.max_token_len_per_gpu)):
        _check_positive(key, value)
    if d.max_length < 2:
        raise ConfigError(f"data.max_length={d.max_length}: a sample needs at least 2 tokens")
    check_micro_batch(d, world=1)
    if not 0 <= o.min_lr_ratio <= 1:
        raise ConfigError(f"optim.min_lr_ratio={o.min_lr_ratio}: must be in [0, 1] (the cosine floor as a fraction "
                          "of the peak lr)")
    if o.num_cycles < 0:
        raise ConfigError(f"optim.num_cycles={o.num_cycles}: must be >= 0 (cosine half-waves over training)")
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        raise ConfigError(f"optim.betas={list(o.betas)}: must be two numbers in [0, 1): AdamW's [beta1, beta2]")
    if d.use_dynamic_bsz and d.max_token_len_per_gpu < d.max_length:
        raise ConfigError(f"data.max_token_len_per_gpu={d.max_token_len_per_gpu} is below data.max_length="
                          f"{d.max_length}: a longest sample would not fit one micro-batch; raise it")
    if m.lora_rank < 0 or (m.lora_rank > 0 and m.lora_alpha <= 0):
        raise ConfigError(f"model.lora_rank={m.lora_rank}, model.lora_alpha={m.lora_alpha}: the rank must be "
                          ">= 0 and, with LoRA, the alpha > 0")
    if t.total_training_steps is not None and t.total_training_steps <= 0:
        raise ConfigError(f"trainer.total_training_steps={t.total_training_steps}: must be > 0 (or null)")
    if t.total_training_steps is None and t.total_epochs <= 0:
        raise ConfigError(f"trainer.total_epochs={t.total_epochs}: must be > 0")
    return [*_logger_warnings(list(t.logger)), *_verl_warnings(cfg), *check_sft_engine(cfg)]


def _verl_warnings(cfg: SFTConfig) -> list[str]:
    from rlforge.config.lora import adapter_path_overrides
    from rlforge.config.user_keys import verl_values
    from rlforge.config.verl_sft_keys import SFT

    return [*SFT.warnings(verl_values(cfg)), *adapter_path_overrides(cfg.model, "model")]


def _logger_warnings(loggers: list[str]) -> list[str]:
    """A warning per verl logger that rlforge lacks (skipped); unknown names raise."""
    import difflib

    from rlforge.config.later_work import SUPPORTED_LOGGERS, VERL_LOGGERS

    out = []
    for name in loggers:
        if name in VERL_LOGGERS:
            out.append(f"trainer.logger: '{name}' (a verl logger) is not supported by rlforge; skipped")
        elif name not in SUPPORTED_LOGGERS:
            close = difflib.get_close_matches(str(name), [*SUPPORTED_LOGGERS, *VERL_LOGGERS], n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"trainer.logger: unknown logger '{name}'.{hint} Valid: {', '.join(SUPPORTED_LOGGERS)}")
    return out

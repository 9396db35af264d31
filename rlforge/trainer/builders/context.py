"""What every role builder reads: the config, the device, the seed, the tokenizer and the per-step
sizes (:class:`BuildContext`); and the job's data (:func:`build_data`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from rlforge.config.data import generation_batch_size
from rlforge.data import PromptLoader, load_rl_dataset
from rlforge.engine.distributed import init_distributed, init_single_process
from rlforge.launch import under_launcher
from rlforge.models import load_tokenizer
from rlforge.rollout.multi_turn.setup import prompt_tool_schemas
from rlforge.trainer import spmd
from rlforge.trainer.builders.engines import pick_device
from rlforge.trainer.builders.sizes import per_step_sizes, token_budgets, total_training_steps


@dataclass(frozen=True)
class BuildContext:
    """Attributes:
        cfg: the validated job config.
        device: this process's device (the process group is initialised).
        seed: ``data.seed`` (1 when unset), for data order, model init and LoRA.
        tokenizer: the policy's tokenizer.
        total_steps: RL steps of the job (the LR schedules' length).
        sizes: :func:`~rlforge.trainer.builders.sizes.per_step_sizes` (sequences, per rank).
        budgets: :func:`~rlforge.trainer.builders.sizes.token_budgets` (tokens, or None).
    """

    cfg: Any
    device: torch.device
    seed: int
    tokenizer: Any
    total_steps: int
    sizes: dict[str, int]
    budgets: dict[str, int | None]


@dataclass(frozen=True)
class DataParts:
    """The prompt loaders: ``train`` and ``val`` (None without ``data.val_files``)."""

    train: PromptLoader
    val: PromptLoader | None


def init_device(cfg: Any) -> torch.device:
    """``trainer.device``, with its process group: one process per device under a launcher, else a
    one-rank group in this process, so that the same sharded engine runs on 1 device and on N.  The
    group's collective timeout is ``actor_rollout_ref.nccl_timeout`` seconds (verl's key)."""
    device = pick_device(cfg.trainer.device)
    timeout = timedelta(seconds=int(cfg.actor_rollout_ref.nccl_timeout))
    if under_launcher():
        return init_distributed(device.type, timeout=timeout).device
    return init_single_process(device, timeout=timeout).device


def build_data(cfg: Any, tokenizer: Any, seed: int) -> DataParts:
    """The train and validation prompt loaders (``data.*``).

    Raises:
        RLForgeError subclasses for bad paths, files or rows.
    """
    tools = prompt_tool_schemas(cfg)  # rendered by the chat template's tools= where it renders them
    train_ds = load_rl_dataset(cfg.data.train_files, tokenizer, cfg.data, split="train", tools=tools)
    gen_bs = generation_batch_size(cfg)  # data.gen_batch_size under DAPO's dynamic sampling
    key = "data.gen_batch_size" if gen_bs != cfg.data.train_batch_size else "data.train_batch_size"
    train = PromptLoader(train_ds, gen_bs, shuffle=cfg.data.shuffle, seed=seed, batch_size_key=key)
    val = None
    if cfg.data.val_files:
        val_ds = load_rl_dataset(cfg.data.val_files, tokenizer, cfg.data, split="val", tools=tools)
        val_bs = cfg.data.val_batch_size or len(val_ds)
        val = PromptLoader(val_ds, min(val_bs, len(val_ds)), shuffle=bool(cfg.data.validation_shuffle), seed=seed,
                           drop_last=False,
                           batch_size_key="data.val_batch_size")
    return DataParts(train, val)


def build_context(cfg: Any) -> tuple[BuildContext, DataParts]:
    """The device (and process group), tokenizer, data and sizes of the job ``cfg``."""
    device = init_device(cfg)
    arr = cfg.actor_rollout_ref
    seed = int(cfg.data.seed if cfg.data.seed is not None else 1)
    tokenizer = load_tokenizer(arr.model.path, arr.model.tokenizer_path)
    data = build_data(cfg, tokenizer, seed)
    ctx = BuildContext(cfg, device, seed, tokenizer, total_training_steps(cfg, len(data.train)),
                       per_step_sizes(cfg, spmd.world()[1]), token_budgets(cfg))
    return ctx, data

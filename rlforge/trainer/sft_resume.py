"""Resuming an SFT run (``trainer.resume_mode`` / ``resume_from_path``, verl's SFT semantics) from the
checkpoints :class:`rlforge.trainer.sft_trainer.SFTTrainer` writes, with the RL trainer's pieces:
:func:`rlforge.trainer.checkpoint.pick_checkpoint` (tracker file, manifest check),
:func:`rlforge.trainer.checkpoint.restore` (the engine's model / adapter, optimizer and schedule, shapes
checked first) and :mod:`rlforge.trainer.resume_config` (the keys that cannot change; the optimizer
settings of the current config put back).

What a resume restores: the engine state, every RNG state and the step.  The data position is the
step: the SFT data order is a function of ``trainer.seed``, the epoch and the step
(:meth:`~rlforge.trainer.sft_trainer.SFTTrainer.batch_rows`), so the steps after the checkpoint
take the batches an uninterrupted run takes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlforge.errors import RLForgeError

SFT_FROZEN: tuple[str, ...] = tuple(f"model.{k}" for k in (
    "path", "tokenizer_path", "override_config", "lora_rank", "lora_alpha", "target_modules", "exclude_modules",
    "lora_adapter_path"))
"""SFT keys whose value must equal the checkpoint's (they decide the saved state's shapes and meaning)."""


def pick_sft_checkpoint(trainer_cfg: Any) -> Path | None:
    """The checkpoint folder that ``trainer.resume_mode`` names, verified against its manifest; None to start
    from ``model.path``.  ``auto``: ``resume_from_path`` when set (as verl's SFT trainer), else the one the
    tracker file of ``default_local_dir`` names, if any; ``resume_path``: ``resume_from_path``; ``disable``: None.

    Raises:
        ConfigError / CheckpointError: a missing or incomplete checkpoint, or one that fails its manifest.
    """
    from rlforge.trainer.checkpoint import pick_checkpoint

    mode = str(trainer_cfg.resume_mode)
    if mode == "auto" and trainer_cfg.resume_from_path:
        mode = "resume_path"
    return pick_checkpoint(mode, trainer_cfg.default_local_dir, trainer_cfg.resume_from_path)


def shared_checkpoint(trainer_cfg: Any, rank: int) -> Path | None:
    """:func:`pick_sft_checkpoint` on rank 0, the same answer (or error) on every rank (a collective)."""
    from rlforge.trainer import spmd

    found: tuple[Path | None, RLForgeError | None] = (None, None)
    if rank == 0:
        try:
            found = (pick_sft_checkpoint(trainer_cfg), None)
        except RLForgeError as e:  # every rank raises it, none waits in a collective
            found = (None, e)
    path, error = spmd.gather_objects(found)[0]
    if error is not None:
        raise error
    return path


def restore_sft(engine: Any, ckpt: Path, current_yaml: str,
                reference: dict[str, tuple[int, ...]] | None) -> tuple[int, list[Any]]:
    """Load checkpoint ``ckpt`` into ``engine`` and the RNGs; returns ``(global_step, changes)``, the
    config keys changed since the checkpoint (they take effect; the optimizer's ``lr``, schedule,
    ``weight_decay`` and ``betas`` are the current config's).

    Raises:
        CheckpointError: a :data:`SFT_FROZEN` key changed, or the state does not fit the model.
        ConfigError: an unreadable checkpoint file.
    """
    from rlforge.trainer import checkpoint as ckpt_mod
    from rlforge.trainer.resume_config import apply_optim_settings, check_resume_config, optim_settings

    changes = check_resume_config(ckpt, ckpt_mod.CONFIG_FILE, current_yaml, SFT_FROZEN)
    fresh = optim_settings(engine)
    ckpt_mod.restore(engine, ckpt, "model", "model", reference)
    apply_optim_settings(engine, fresh)
    state = ckpt_mod.load_part(ckpt, "trainer_state")
    ckpt_mod.set_rng_state(state["rng"])
    return int(state["global_step"]), changes

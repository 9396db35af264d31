"""The RL trainer's state on disk: the run folder's lock, the resume at start and the save at ``trainer.save_freq``.

Functions of the :class:`~rlforge.trainer.ppo_trainer.PPOTrainer` (``tr``: its ``cfg``, ``job``, ``rank``,
``world_size``, ``out_dir``, ``global_step``, ``kl_ctrl``, ``partial`` and ``checkpointer``), kept apart from the
step loop:

- :func:`take_run_lock`: ``trainer.default_local_dir``, created, and its lock (:mod:`rlforge.trainer.run_lock`);
- :func:`resume`: the checkpoint that ``trainer.resume_mode`` names, verified and compared with this run's
  config (:mod:`rlforge.trainer.resume_config`), into the engines, the data loader, the KL controller, the
  carried-over partial responses and the RNG states;
- :func:`save`: a checkpoint (:class:`~rlforge.trainer.checkpointer.Checkpointer`: sharded, asynchronous per
  role with ``<role>.checkpoint.async_save``), or only the policy's Hugging Face folder with
  ``actor.checkpoint.save_contents=[hf_model]`` alone.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rlforge.config import format_config
from rlforge.config.common import hf_model_only
from rlforge.errors import ConfigError
from rlforge.launch import under_launcher
from rlforge.trainer import checkpoint as ckpt
from rlforge.trainer import spmd
from rlforge.trainer.checkpointer import Role
from rlforge.trainer.dcp_io import is_sharded, load_into
from rlforge.trainer.resume_config import apply_optim_settings, check_resume_config, optim_settings
from rlforge.trainer.run_lock import RunLock
from rlforge.trainer.run_lock import acquire as acquire_run_lock


def take_run_lock(t: Any) -> tuple[RunLock | None, list[Path]]:
    """``trainer.default_local_dir`` (``t``: the trainer block), created, and its run lock; None on ranks other
    than 0 of a launched run (rank 0 holds it for all).  Also the folders this created (deepest first), which a
    run that fails before it starts removes again if still empty (:func:`remove_if_empty`).

    Raises ConfigError when the folder cannot be created."""
    folder = Path(t.default_local_dir).absolute()
    made = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"trainer.default_local_dir={t.default_local_dir}: cannot create it ({e.strerror or e})") from None
    on_existing = str(t.on_existing_run)
    if under_launcher() and int(os.environ.get("RANK", "0") or 0) != 0:
        return None, []
    return acquire_run_lock(t.default_local_dir, on_existing), made


def remove_if_empty(folders: list[Path]) -> None:
    """rmdir each folder (deepest first) that is empty; stop at the first that is not."""
    for p in folders:
        try:
            p.rmdir()
        except OSError:
            return


def resume(tr: Any) -> None:
    """Restore the checkpoint that ``trainer.resume_mode`` names into the trainer ``tr`` (nothing when there is
    none); rank 0 prints where from and which changed keys take effect now."""
    t = tr.cfg.trainer
    fallback = bool(t.resume_fallback)
    path = ckpt.pick_checkpoint(t.resume_mode, tr.out_dir, t.resume_from_path, fallback) if tr.rank == 0 else None
    path = tr._rank0(path)  # rank 0's choice on every rank
    if path is None:
        return
    changes = check_resume_config(path, ckpt.CONFIG_FILE, format_config(tr.cfg))
    reference = tr.job.rollout_shapes  # full shapes (a TP rollout holds slices)
    restore_role(tr.job.actor.engine, path, "actor", "actor_rollout_ref.model", reference)
    tr.job.sync_rollout()  # the rollout's own copy of the policy gets the restored weights
    if tr.job.critic is not None:
        restore_role(tr.job.critic.engine, path, "critic", "critic.model")
    state = ckpt.load_part(path, "trainer_state")
    tr.global_step = int(state["global_step"])
    tr.job.train_loader.load_state_dict(state["dataloader"])
    if tr.partial is not None and "partial_rollout" in state:  # the carried-over responses, exactly
        tr.partial.load_state_dict(state["partial_rollout"])
    if not any(c.key.startswith("algorithm.kl_ctrl.") for c in changes):  # else it restarts from the new keys
        tr.kl_ctrl.load_state_dict(state["kl_ctrl"])
    rng = ckpt.rank_rng(state, tr.rank, tr.world_size)
    if rng is not None:
        ckpt.set_rng_state(rng)
    line = f"resumed from {path} at step {tr.global_step}"
    if changes:
        line += f"; changed since that checkpoint, taking effect now: {'; '.join(str(c) for c in changes)}"
    if tr.rank == 0:
        print(line, flush=True)


def restore_role(engine: Any, path: Path, name: str, model_key: str,
                 reference: dict[str, tuple[int, ...]] | None = None) -> None:
    """One role's model, optimizer and schedule from ``path`` (sharded or full format), with this run's
    optimizer settings (lr, schedule, weight decay, betas) taking effect over the saved ones."""
    fresh = optim_settings(engine)
    if is_sharded(path, name):
        load_into(engine, path / name, model_key, reference)
    else:
        ckpt.restore(engine, path, name, model_key, reference)
    apply_optim_settings(engine, fresh)


def save(tr: Any) -> None:
    """The trainer ``tr``'s checkpoint at step ``tr.global_step`` (see the module docstring)."""
    cfg, job = tr.cfg, tr.job
    actor_ckpt = cfg.actor_rollout_ref.actor.checkpoint
    if hf_model_only(actor_ckpt.save_contents):
        tr.checkpointer.wait()  # an export-only save never overtakes a checkpoint in flight
        model = _full_actor_state(job)
        if tr.rank == 0:
            ckpt.save_checkpoint(tr.out_dir, tr.global_step, {}, cfg.trainer.max_actor_ckpt_to_keep,
                                 hf_exports(cfg, job, model), config=format_config(cfg), resumable=False)
        spmd.barrier()
        return
    lora = {"lora": job.actor_lora.state()} if job.actor_lora is not None else {}  # for `rlforge export`
    roles = {"actor": Role(job.actor.engine, bool(actor_ckpt.async_save), lora)}
    if job.critic is not None:
        roles["critic"] = Role(job.critic.engine, bool(cfg.critic.checkpoint.async_save))
    exports = hf_exports(cfg, job, _full_actor_state(job)) if "hf_model" in actor_ckpt.save_contents else {}
    trainer_state = {
        "global_step": tr.global_step,
        "dataloader": job.train_loader.state_dict(),
        "kl_ctrl": tr.kl_ctrl.state_dict(),
        "rng": ckpt.rng_state(),
        "world_size": tr.world_size,
    }
    if tr.partial is not None:
        trainer_state["partial_rollout"] = tr.partial.state_dict()
    tr.checkpointer.save(tr.out_dir, tr.global_step, roles, trainer_state, config=format_config(cfg),
                         exports=exports, max_to_keep=cfg.trainer.max_actor_ckpt_to_keep)


def _full_actor_state(job: Any) -> dict[str, Any]:
    """The policy's full (gathered, CPU, master-dtype) model state for ``hf_model`` (a collective; rank 0's
    is whole; a LoRA run's: the adapter)."""
    return job.actor.engine.state_dict()["model"]


def hf_exports(cfg: Any, job: Any, model_state: dict[str, Any]) -> dict[str, Any]:
    """``hf_model`` in ``actor.checkpoint.save_contents``: a Hugging Face folder of the policy
    (``actor/huggingface``; with LoRA a peft adapter folder) with the tokenizer; a policy loss's log Z head only
    where its hooks ask for it (``exports_extra_modules``).  The weights come from the engine's full
    (gathered, CPU, master-dtype) ``model_state``, not from the rollout's compute-dtype copy.  Returns
    ``{relative folder: writer(folder)}`` for :func:`rlforge.trainer.checkpoint.save_checkpoint`."""
    actor_cfg = cfg.actor_rollout_ref.actor
    if "hf_model" not in actor_cfg.checkpoint.save_contents:
        return {}
    lm, tok = job.rollout_model, job.tokenizer
    wrapped = any(k.startswith("log_z_head.") for k in model_state)  # PolicyWithLogZ: lm.* and log_z_head.*
    lm_state = {k[3:]: v for k, v in model_state.items() if k.startswith("lm.")} if wrapped else model_state
    head = {k[len("log_z_head."):]: v for k, v in model_state.items() if k.startswith("log_z_head.")}
    export_head = bool(head) and job.actor.hooks.exports_extras(actor_cfg)
    plan = job.actor_lora

    def write(folder: Path) -> None:
        if plan is not None:  # LoRA: a peft adapter folder (PeftModel.from_pretrained(base, folder))
            from rlforge.models.lora import write_adapter_folder

            write_adapter_folder(folder, plan, lm_state)
        else:
            lm.save_pretrained(folder, state_dict=lm_state)
        tok.save_pretrained(folder)
        if export_head:
            from safetensors.torch import save_file

            save_file({k: v.detach().cpu().contiguous() for k, v in head.items()},
                      str(folder / "log_z_head.safetensors"))

    return {"actor/huggingface": write}

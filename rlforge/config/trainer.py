"""``trainer.*``: the run loop, logging, checkpoints and devices (verl key names and defaults)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TrainerConfig:
    """Run-level settings."""

    balance_batch: bool = True
    """Reorder the batch so data-parallel ranks get similar token counts."""
    total_epochs: int = 30
    """Passes over the training set (ignored once ``total_training_steps`` is reached)."""
    total_training_steps: int | None = None
    """Stop after this many steps; None = ``total_epochs`` x batches per epoch."""
    project_name: str = "rlforge"
    """Project name for loggers and checkpoint paths (verl: ``verl_examples``)."""
    experiment_name: str = "default"
    """Run name for loggers and checkpoint paths (verl: ``gsm8k``)."""
    logger: list[str] = field(default_factory=lambda: ["console"])
    """Loggers: ``console`` | ``file`` (``metrics.jsonl``) | ``tensorboard`` (``tensorboard/``) | ``wandb``
    (offline unless ``WANDB_MODE`` is set) | ``mlflow`` (``mlruns/`` unless ``MLFLOW_TRACKING_URI`` is set), all
    under ``default_local_dir``.  verl's other loggers are skipped with a warning.  verl defaults to
    ``[console, wandb]``; rlforge defaults to ``[console]``."""
    log_val_generations: int = 0
    """Validation samples (prompt, response, score) logged per validation; 0 = none."""
    rollout_data_dir: str | None = None
    """Dump training rollouts as JSONL here; None = no dump."""
    validation_data_dir: str | None = None
    """Dump validation generations as JSONL here; None = no dump."""
    nnodes: int = 1
    """Number of machines.  Under a launcher that sets ``WORLD_SIZE`` (torchrun) the launcher's world
    size is used; ``nnodes x n_gpus_per_node`` is then checked against it only where it was changed
    from the default ``1 x 1`` (:mod:`rlforge.config.world`)."""
    n_gpus_per_node: int = 1
    """Devices (processes) per machine (verl: 8).  Without a launcher, ``rlforge train`` with K > 1
    starts K processes itself; under one, it may be left out (see ``nnodes``)."""
    save_freq: int = -1
    """Save a checkpoint every this many steps; -1 = no periodic saves."""
    esi_redundant_time: int = 0
    """Seconds reserved before an expected preemption to save a last checkpoint."""
    resume_mode: str = "auto"
    """``auto`` (latest in ``default_local_dir`` if any) | ``disable`` (start over; in a folder holding an
    earlier run's output, in a new sub-folder ``run-<N>`` of it, leaving that output as it is) | ``resume_path``
    (use ``resume_from_path``).  A run whose config differs from the one saved in its folder on the keys that make
    it another run (the model, the data, the batch's shape: :mod:`rlforge.trainer.run_folder`) stops with one error
    unless it is ``disable``."""
    resume_from_path: str | None = None
    """Checkpoint folder for ``resume_mode=resume_path``; None = unset."""
    resume_fallback: bool = False
    """rlforge addition: when the checkpoint to resume from fails its ``manifest.json`` check (a file
    corrupted, truncated or missing), resume from the newest older ``global_step_N`` in the same folder
    that passes it, with a warning; False = stop with an error naming the file."""
    on_existing_run: str = "error"
    """rlforge addition: what a run does when another live run holds ``default_local_dir``'s lock
    (``.rlforge.lock``): ``error`` = stop with one message naming the holder | ``append`` = write
    into a new ``run-<date>-<pid>`` sub-folder of it (starting fresh there)."""
    val_before_train: bool = True
    """Validate once before the first step."""
    val_only: bool = False
    """Validate and exit without training."""
    test_freq: int = -1
    """Validate every this many steps; -1 = never during training."""
    critic_warmup: int = 0
    """Steps that update only the critic before the actor starts."""
    default_hdfs_dir: str | None = None
    """Remote checkpoint copy location; None = none (accepted; not used)."""
    del_local_ckpt_after_load: bool = False
    """Delete the local checkpoint after resuming from it."""
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    """The run folder: checkpoints, ``metrics.jsonl``, traces and ``run_config.yaml`` (the config of the run it
    holds; one run per folder, see ``resume_mode``)."""
    max_actor_ckpt_to_keep: int | None = None
    """Keep at most this many actor checkpoints; None = all."""
    max_critic_ckpt_to_keep: int | None = None
    """Keep at most this many critic checkpoints; None = all."""
    ray_wait_register_center_timeout: int = 300
    """Seconds to wait for Ray workers (accepted; rlforge does not use Ray)."""
    device: str = "auto"
    """``auto`` (cuda if available else cpu) | ``cuda`` | ``cuda:<i>`` | ``cpu``.  rlforge addition; verl's default is ``cuda``."""
    profile: bool = False
    """rlforge addition: write a Chrome/Perfetto trace of every timed stage on every rank to
    ``<default_local_dir>/trace/rank<R>.json`` (open it in ui.perfetto.dev), and on a GPU every
    utilisation sample to ``trace/gpu_samples_rank<R>.jsonl``.  ``rlforge perf report`` reads both."""
    profile_steps: list[int] | None = None
    """Global steps (1-based) recorded with ``torch.profiler`` (CPU and CUDA activities) into
    ``<default_local_dir>/trace/torch_rank<R>_step<N>.json``; None = none.  verl uses this key for Nsight."""
    gpu_sample_interval_s: float = 0.1
    """rlforge addition: seconds between NVML samples of this rank's GPU (utilisation, memory, power),
    giving ``perf/gpu_util/*`` and ``perf/idle_ratio``; 0 = no sampling.  No effect without a GPU."""
    use_legacy_worker_impl: str = "auto"
    """verl worker implementation switch (accepted; no effect)."""

"""The first and last lines of an ``rlforge train`` run.

    rlforge train: start | model preset:tiny | task builtin:arithmetic | algorithm grpo | 2 steps | device cpu | output DIR
    ... one line per step ...
    rlforge train: done in 41.2 s at step 2 | val-core/arithmetic/reward/mean@1 0.125 (step 0) -> 0.25 (step 2)
    rlforge train: metrics DIR/metrics.jsonl | model DIR/global_step_2/actor/huggingface (Hugging Face folder)

The start line is printed before anything slow (model loading), by the process that the user
started; the summary by rank 0 after the last step.  A launched run's workers inherit
:data:`START_ENV` (the start time), so rank 0 measures from the user's start and does not
repeat the start line.  The elapsed time counts from the command's start (imports included).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlforge.trainer.cpu_threads import ENV as THREADS_ENV
from rlforge.trainer.cpu_threads import CpuThreads

START_ENV = "RLFORGE_RUN_START"
"""Environment variable: the run's start time (``time.time()``), set once the start line is printed."""


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def _steps(cfg: Any) -> str:
    t = cfg.trainer
    if t.total_training_steps is not None:
        return _plural(int(t.total_training_steps), "step")
    return f"{_plural(int(t.total_epochs), 'epoch')} (trainer.total_epochs)"


def _files(value: Any) -> str:
    if value is None:
        return "none"
    return value if isinstance(value, str) else ",".join(str(v) for v in value)


def start_line(cfg: Any, device: str, threads: CpuThreads | None = None) -> str:
    """One line naming the model, the task, the length, the device (with ``threads``, torch's CPU
    threads per process) and the output folder."""
    t = cfg.trainer
    procs = int(t.nnodes) * int(t.n_gpus_per_node)
    where = device if procs <= 1 else f"{device} x {procs} processes"
    if threads is not None:
        where += f" ({threads.describe(procs)})"
    return (f"rlforge train: start | model {cfg.actor_rollout_ref.model.path} | task {_files(cfg.data.train_files)} "
            f"| algorithm {cfg.algorithm.adv_estimator} | {_steps(cfg)} | device {where} "
            f"| output {t.default_local_dir}")


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60} min"


def _validation(first: tuple[int, dict[str, float]] | None, last: tuple[int, dict[str, float]] | None) -> str:
    if first is None or last is None:
        return "no validation"
    parts = []
    for key in sorted(k for k in last[1] if not k.endswith("/std")):  # val_kwargs.n > 1: the bootstrap means only
        if key in first[1] and first[0] != last[0]:
            parts.append(f"{key} {first[1][key]:.4g} (step {first[0]}) -> {last[1][key]:.4g} (step {last[0]})")
        else:
            parts.append(f"{key} {last[1][key]:.4g} (step {last[0]})")
    return " | ".join(parts)


def _metrics_where(loggers: list[str], out_dir: Path) -> str:
    where = {
        "file": str(out_dir / "metrics.jsonl"),
        "tensorboard": str(out_dir / "tensorboard"),
        "wandb": str(out_dir / "wandb"),
        "mlflow": os.environ.get("MLFLOW_TRACKING_URI") or str(out_dir / "mlruns"),
    }
    shown = [where[name] for name in loggers if name in where]
    return ", ".join(shown) if shown else "console only (trainer.logger=[console,file] writes metrics.jsonl)"


def _model_where(cfg: Any, out_dir: Path, step: int) -> str:
    from rlforge.config.common import hf_model_only

    folder = out_dir / f"global_step_{step}"
    if not folder.is_dir():
        return f"not saved (trainer.save_freq={cfg.trainer.save_freq})"
    hf = folder / "actor" / "huggingface"
    if not hf.is_dir():  # a checkpoint only: say how to get a model that transformers loads
        return f"{folder} (a checkpoint; `rlforge export {folder} --out DIR` writes a Hugging Face folder)"
    adapter = (hf / "adapter_config.json").is_file()  # LoRA: an adapter, loaded on top of its base model
    if hf_model_only(cfg.actor_rollout_ref.actor.checkpoint.save_contents):  # no checkpoint beside it
        return f"{hf} ({'peft adapter folder' if adapter else 'Hugging Face folder'})"
    if adapter:
        return (f"{folder} (peft adapter folder: {hf}; `rlforge export {folder} --out DIR --merge` writes the "
                "merged model as a Hugging Face folder)")
    return f"{folder} (Hugging Face folder: {hf})"


def end_lines(cfg: Any, loggers: list[str], elapsed_s: float, step: int,
              first_val: tuple[int, dict[str, float]] | None,
              last_val: tuple[int, dict[str, float]] | None) -> list[str]:
    """The summary: elapsed time, first and last validation scores, where the metrics and the model are."""
    out_dir = Path(cfg.trainer.default_local_dir)
    return [
        f"rlforge train: done in {_duration(elapsed_s)} at step {step} | "
        f"{_validation(first_val, last_val)}",
        f"rlforge train: metrics {_metrics_where(loggers, out_dir)} | model {_model_where(cfg, out_dir, step)}",
    ]


def announce_start(cfg: Any, started: float, threads: CpuThreads | None = None) -> float:
    """Print the start line (``threads``: :func:`rlforge.trainer.cpu_threads.apply_cpu_threads`'s
    choice) unless this is a worker that :func:`launching` started (then the user's process printed
    it); return the run's start time (``time.time()``)."""
    from rlforge.launch import under_launcher
    from rlforge.trainer.builders.engines import pick_device

    inherited = os.environ.get(START_ENV) if under_launcher() else None
    if inherited:
        return float(inherited)
    if os.environ.get("RANK", "0") == "0":  # an external torchrun: rank 0 prints it
        print(start_line(cfg, pick_device(cfg.trainer.device).type, threads), flush=True)
    return started


@contextmanager
def launching(started: float, threads: CpuThreads | None = None) -> Iterator[None]:
    """While launching workers: they inherit the start time in :data:`START_ENV` and, with rlforge's
    choice of ``threads`` (not the user's), ``OMP_NUM_THREADS`` (both removed after, so that a later
    run in this process starts afresh)."""
    from rlforge.launch import under_launcher

    if under_launcher():
        yield
        return
    os.environ[START_ENV] = repr(started)
    ours = threads is not None and not threads.from_env
    if ours:
        os.environ[THREADS_ENV] = str(threads.num)
    try:
        yield
    finally:
        os.environ.pop(START_ENV, None)
        if ours:
            os.environ.pop(THREADS_ENV, None)


def first_validation_in(path: Path) -> tuple[int, dict[str, float]] | None:
    """The earliest validation (``val-core/*`` metrics with its step) in a ``metrics.jsonl`` file
    (:class:`~rlforge.tracking.FileLogger`'s; a resumed run appends to it); None when the file is
    missing or holds none.  Unreadable lines (a crash mid-line) are skipped."""
    first: tuple[int, dict[str, float]] | None = None
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for text in lines:
        try:
            row = json.loads(text)
            step = int(row["step"])
            val = {k: float(v) for k, v in row.items() if k.startswith("val-core/")}
        except (ValueError, TypeError, KeyError, AttributeError):
            continue
        if val and (first is None or step < first[0]):
            first = (step, val)
    return first


def run_first_validation(out_dir: Path, seen: tuple[int, dict[str, float]] | None
                         ) -> tuple[int, dict[str, float]] | None:
    """The run's first validation: the earliest in ``out_dir/metrics.jsonl`` (from before a resume,
    too) where that comes before ``seen`` (the first this process logged), else ``seen``."""
    logged = first_validation_in(out_dir / "metrics.jsonl")
    if logged is not None and (seen is None or logged[0] < seen[0]):
        return logged
    return seen


def print_summary(cfg: Any, loggers: list[str], started: float, trainer: Any) -> None:
    """The summary lines of a finished :class:`~rlforge.trainer.ppo_trainer.PPOTrainer` run (rank 0).
    After a resume, "before" is the run's first validation (step 0's), read from its ``metrics.jsonl``."""
    if trainer.rank != 0:
        return
    tracker = trainer.tracker
    first = run_first_validation(Path(cfg.trainer.default_local_dir), tracker.first_validation)
    for line in end_lines(cfg, loggers, time.time() - started, trainer.global_step,
                          first, tracker.last_validation):
        print(line, flush=True)

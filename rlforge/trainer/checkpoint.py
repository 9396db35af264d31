"""Checkpoints: ``<trainer.default_local_dir>/global_step_N``.

A checkpoint holds, per trained role, the model weights, optimizer and LR-scheduler
state (``actor/state.pt``, ``critic/state.pt``: ``{"model": HF-keyed full state dict,
"optimizer", "scheduler"}`` whatever the engine), plus ``trainer_state.pt``: global step,
data-loader position, KL-controller state and every RNG state (Python, NumPy, torch CPU
and CUDA), and ``config.yaml``: the run's resolved config, from which ``rlforge export``
rebuilds the model and tokenizer (:mod:`rlforge.trainer.export`).  It is written into a
temporary folder that is renamed into place only when complete, and
``latest_checkpointed_iteration.txt`` (verl's tracker file) is updated last, so nothing
half-written ever looks like a valid checkpoint.

With ``actor.checkpoint.save_contents=[hf_model]`` alone, a save writes only
``actor/huggingface`` and ``config.yaml`` into ``global_step_N`` (``resumable=False``): the trained
policy, not a checkpoint; the tracker file is not updated, and is removed if it named that folder.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlforge.errors import ConfigError

TRACKER = "latest_checkpointed_iteration.txt"
CONFIG_FILE = "config.yaml"
"""The run's resolved config in each checkpoint (what ``rlforge export`` rebuilds the model from)."""


def rng_state() -> dict[str, Any]:
    """All RNG states that influence a step."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(
    root: str | Path, step: int, parts: dict[str, dict[str, Any]], max_to_keep: int | None = None,
    exports: dict[str, Callable[[Path], None]] | None = None, config: str | None = None,
    resumable: bool = True,
) -> Path:
    """Write ``parts`` (``{"actor": state, "critic": state, "trainer_state": state}``) atomically.

    ``config`` (the resolved config's YAML) is written as ``config.yaml``.  ``exports`` maps a
    sub-folder (e.g. ``actor/huggingface``) to a function that writes into it; they run inside
    the temporary folder, so they are atomic too.  Returns the checkpoint folder.  Older
    checkpoints beyond ``max_to_keep`` are removed.  ``resumable=False`` (``parts`` without
    ``trainer_state``: an export-only save) leaves the tracker file alone, or removes it when it
    named the folder just replaced.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"global_step_{step}"
    for stale in root.glob(".global_step_*.tmp-*"):  # left by a run killed while saving
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".global_step_{step}.tmp-{os.getpid()}"
    tmp.mkdir()
    try:
        for name, state in parts.items():
            if name == "trainer_state":
                torch.save(state, tmp / "trainer_state.pt")
            else:
                (tmp / name).mkdir()
                torch.save(state, tmp / name / "state.pt")
        if config is not None:
            (tmp / CONFIG_FILE).write_text(config)
        for sub, write in (exports or {}).items():
            (tmp / sub).mkdir(parents=True, exist_ok=True)
            write(tmp / sub)
        old = root / f".global_step_{step}.tmp-{os.getpid()}-old"
        if final.exists():  # move the old one aside first: a kill now leaves a valid folder or none
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if resumable:
        tracker_tmp = root / f".{TRACKER}.tmp"
        tracker_tmp.write_text(str(step))
        os.replace(tracker_tmp, root / TRACKER)
    elif (root / TRACKER).is_file() and (root / TRACKER).read_text().strip() == str(step):
        (root / TRACKER).unlink()  # the checkpoint it named was just replaced by an export-only folder
    if max_to_keep and max_to_keep > 0:
        steps = sorted(int(p.name.rsplit("_", 1)[1]) for p in root.glob("global_step_*") if p.is_dir())
        for old in steps[:-max_to_keep]:
            shutil.rmtree(root / f"global_step_{old}", ignore_errors=True)
    return final


def find_resume_path(resume_mode: str, default_local_dir: str | Path, resume_from_path: str | None) -> Path | None:
    """The checkpoint folder to resume from, or None to start fresh.

    ``auto``: the latest complete checkpoint in ``default_local_dir`` if any;
    ``disable``: never; ``resume_path``: ``resume_from_path`` (must exist).

    Raises:
        ConfigError: for ``resume_path`` without a valid ``trainer.resume_from_path``.
    """
    if resume_mode == "disable":
        return None
    if resume_mode == "resume_path":
        if not resume_from_path:
            raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint folder>")
        p = Path(resume_from_path).expanduser()
        if not (p / "trainer_state.pt").exists():
            raise ConfigError(
                f"trainer.resume_from_path={resume_from_path}: not a complete rlforge checkpoint "
                "(expected a global_step_N folder with trainer_state.pt)"
            )
        return p
    tracker = Path(default_local_dir) / TRACKER
    if not tracker.exists():
        return None
    text = tracker.read_text().strip()
    p = Path(default_local_dir) / f"global_step_{text}"
    if not text.isdigit() or not (p / "trainer_state.pt").exists():
        raise ConfigError(
            f"{tracker} points to {p.name}, which is not a complete checkpoint. Fix or delete the tracker file, "
            "set trainer.resume_mode=resume_path with trainer.resume_from_path=<a global_step_N folder>, or "
            "trainer.resume_mode=disable to start over (existing checkpoints may then be overwritten)"
        )
    return p


def load_part(ckpt: Path, name: str) -> dict[str, Any]:
    """Load one part (``actor``, ``critic`` or ``trainer_state``) of a checkpoint on the CPU.

    Raises:
        ConfigError: the file is missing or unreadable (truncated, corrupt).
    """
    path = ckpt / "trainer_state.pt" if name == "trainer_state" else ckpt / name / "state.pt"
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        raise ConfigError(f"checkpoint file {path} is missing, corrupt or incomplete ({e.__class__.__name__}: "
                          f"{str(e).splitlines()[0] if str(e) else ''})") from None


def restore(engine: Any, ckpt: Path, name: str, model_key: str) -> None:
    """Load part ``name`` of ``ckpt`` into ``engine``.

    Raises:
        ConfigError: unreadable file, or a state that does not fit the model (another
            architecture or ``override_config``), naming ``model_key``.
    """
    state = load_part(ckpt, name)
    try:
        engine.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError) as e:
        raise ConfigError(
            f"checkpoint {ckpt / name} does not match the model built from {model_key}.* "
            f"({str(e).splitlines()[0][:200]}); resume with the same model settings or set trainer.resume_mode=disable"
        ) from None

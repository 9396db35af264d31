"""Checkpoints: ``<trainer.default_local_dir>/global_step_N``.

A checkpoint holds, per trained role, the model weights, optimizer and LR-scheduler
state (``actor/state.pt``, ``critic/state.pt``: ``{"model": HF-keyed full state dict,
"optimizer", "scheduler"}`` whatever the engine), plus ``trainer_state.pt``: global step,
data-loader position, KL-controller state and every RNG state (Python, NumPy, torch CPU
and CUDA), and ``config.yaml``: the run's resolved config, from which ``rlforge export``
rebuilds the model and tokenizer (:mod:`rlforge.trainer.export`).  It is written into a
temporary folder that is renamed into place only when complete, and
``latest_checkpointed_iteration.txt`` (verl's tracker file) is updated last, so nothing
half-written ever looks like a valid checkpoint.  Before the rename, ``manifest.json`` (resumable saves) records the
SHA-256 and size of every file (:mod:`rlforge.trainer.manifest`); a resume checks them first and
refuses a corrupted checkpoint (or, with ``trainer.resume_fallback``, takes the previous one).

With ``actor.checkpoint.save_contents=[hf_model]`` alone, a save writes only
``actor/huggingface`` and ``config.yaml`` into ``global_step_N`` (``resumable=False``): the trained
policy, not a checkpoint; the tracker file is not updated, and is removed if it named that folder.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlforge.errors import CheckpointError, ConfigError
from rlforge.file_modes import follow_umask
from rlforge.trainer.manifest import verify_manifest, write_manifest

TRACKER = "latest_checkpointed_iteration.txt"
log = logging.getLogger(__name__)
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


def new_tmp(root: str | Path, step: int) -> Path:
    """A fresh temporary folder for ``global_step_{step}`` in ``root`` (created with ``root``), after removing
    the ones a run killed while saving left behind.  Called by rank 0 only, with no save in flight."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".global_step_*.tmp-*"):  # left by a run killed while saving
        shutil.rmtree(stale, ignore_errors=True)
    tmp = root / f".global_step_{step}.tmp-{os.getpid()}"
    tmp.mkdir()
    return tmp


def write_files(tmp: Path, parts: dict[str, dict[str, Any]], config: str | None = None,
                exports: dict[str, Callable[[Path], None]] | None = None) -> None:
    """Write the full-state ``parts`` (``trainer_state`` -> ``trainer_state.pt``, a role -> ``<role>/state.pt``),
    ``config`` as ``config.yaml`` and each export's sub-folder into the temporary folder ``tmp``."""
    for name, state in parts.items():
        if name == "trainer_state":
            torch.save(state, tmp / "trainer_state.pt")
        else:
            (tmp / name).mkdir(exist_ok=True)
            torch.save(state, tmp / name / "state.pt")
    if config is not None:
        (tmp / CONFIG_FILE).write_text(config)
    for sub, write in (exports or {}).items():
        (tmp / sub).mkdir(parents=True, exist_ok=True)
        write(tmp / sub)


def commit(tmp: Path, step: int, max_to_keep: int | None = None, resumable: bool = True) -> Path:
    """Make the complete temporary folder ``tmp`` the checkpoint ``global_step_{step}`` beside it: its
    manifest (resumable saves), the rename, then the tracker file, then the pruning of older checkpoints
    beyond ``max_to_keep``.  A kill at any point leaves the previous checkpoint the latest.  On an error
    ``tmp`` is removed.  Returns the checkpoint folder."""
    root = tmp.parent
    final = root / f"global_step_{step}"
    try:
        if resumable:  # after every file, before the folder (and then the tracker) names them
            write_manifest(tmp)
        follow_umask(tmp)  # safetensors writes 0600 files
        old = root / f"{tmp.name}-old"
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
        steps = sorted(int(p.name.rsplit("_", 1)[1]) for p in root.glob("global_step_*")
                       if p.is_dir() and p.name.rsplit("_", 1)[1].isdigit())
        for gone in steps[:-max_to_keep]:
            shutil.rmtree(root / f"global_step_{gone}", ignore_errors=True)
    return final


def rank_rng(trainer_state: dict[str, Any], rank: int, world_size: int) -> dict[str, Any] | None:
    """The RNG states rank ``rank`` resumes with: its own (``rng_per_rank``, saved since sharded checkpoints),
    None for a rank beyond the saving world (it keeps its fresh per-rank seed), or, for a checkpoint without
    per-rank states (an older rlforge), rank 0's ``rng``.  Rank 0 warns once when the world size changed:
    sampling then differs from an uninterrupted run's."""
    per_rank = trainer_state.get("rng_per_rank")
    if not per_rank:
        return trainer_state["rng"]
    if len(per_rank) != world_size and rank == 0:
        log.warning("the checkpoint was saved by %d ranks and resumes on %d: ranks keep their own RNG streams "
                    "where saved (fresh ones beyond), so sampling differs from an uninterrupted run",
                    len(per_rank), world_size)
    return per_rank[rank] if rank < len(per_rank) else None


def save_checkpoint(
    root: str | Path, step: int, parts: dict[str, dict[str, Any]], max_to_keep: int | None = None,
    exports: dict[str, Callable[[Path], None]] | None = None, config: str | None = None,
    resumable: bool = True,
) -> Path:
    """Write ``parts`` (``{"actor": state, "critic": state, "trainer_state": state}``) atomically, in one
    process (full states: the sharded, asynchronous saves are :mod:`rlforge.trainer.checkpointer`'s).

    ``config`` (the resolved config's YAML) is written as ``config.yaml``.  ``exports`` maps a
    sub-folder (e.g. ``actor/huggingface``) to a function that writes into it; they run inside
    the temporary folder, so they are atomic too.  Returns the checkpoint folder.  Older
    checkpoints beyond ``max_to_keep`` are removed.  ``resumable=False`` (``parts`` without
    ``trainer_state``: an export-only save) leaves the tracker file alone, or removes it when it
    named the folder just replaced.
    """
    tmp = new_tmp(root, step)
    try:
        write_files(tmp, parts, config, exports)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return commit(tmp, step, max_to_keep, resumable)


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
    try:
        text = tracker.read_text(errors="replace").strip()
    except OSError as e:  # a folder, unreadable
        text = f"? ({e.strerror or e})"
    p = Path(default_local_dir) / f"global_step_{text}"
    if not text.isdigit() or not (p / "trainer_state.pt").exists():
        raise ConfigError(
            f"{tracker} points to {p.name}, which is not a complete checkpoint. Fix or delete the tracker file, "
            "set trainer.resume_mode=resume_path with trainer.resume_from_path=<a global_step_N folder>, or "
            "trainer.resume_mode=disable to start over in a fresh sub-folder (the existing files are left as they are)"
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


def _previous(ckpt: Path) -> list[Path]:
    """Complete checkpoints older than ``ckpt`` in its folder, newest first."""
    try:
        step = int(ckpt.name.rsplit("_", 1)[1])
    except (IndexError, ValueError):
        return []
    older = []
    for p in ckpt.parent.glob("global_step_*"):
        tail = p.name.rsplit("_", 1)[1]
        if tail.isdigit() and int(tail) < step and (p / "trainer_state.pt").is_file():
            older.append((int(tail), p))
    return [p for _, p in sorted(older, reverse=True)]


RESUMABLE_KEY = "actor_rollout_ref.actor.checkpoint.save_contents"
"""The key whose ``model``, ``optimizer`` and ``extra`` make a save resumable."""


def _warn_unresumable(root: Path) -> None:
    """One warning when ``root`` holds ``global_step_*`` folders but none can be resumed (saves of
    ``save_contents=[hf_model]`` alone hold the policy's Hugging Face folder, not its state)."""
    folders = [p for p in root.glob("global_step_*") if p.is_dir()]
    if not folders or any((p / "trainer_state.pt").is_file() for p in folders):
        return  # nothing saved, or a checkpoint the tracker file does not name (not this warning's case)
    saved = [p.name for p in folders]
    newest = max(saved, key=lambda n: int(n.rsplit("_", 1)[1]) if n.rsplit("_", 1)[1].isdigit() else -1)
    log.warning("%s holds %d global_step_* folder(s) (newest %s) but none can be resumed (no model or optimizer "
                "state): starting at step 0. To make checkpoints resumable, set %s=[model,optimizer,extra] "
                "(add hf_model to keep the Hugging Face folder too)", root, len(saved), newest, RESUMABLE_KEY)


def pick_checkpoint(resume_mode: str, default_local_dir: str | Path, resume_from_path: str | None,
                    fallback: bool = False) -> Path | None:
    """:func:`find_resume_path`, verified against its ``manifest.json``.

    With ``fallback`` (``trainer.resume_fallback``) a corrupted checkpoint is skipped, with a
    warning, for the newest older one that verifies.

    Raises:
        CheckpointError: the checkpoint's files do not match its manifest (and no fallback was asked
            for, or no older checkpoint verifies), naming the file and the checkpoint.
    """
    path = find_resume_path(resume_mode, default_local_dir, resume_from_path)
    if path is None:
        if resume_mode == "auto":
            _warn_unresumable(Path(default_local_dir))
        return None
    try:
        verify_manifest(path)
        return path
    except CheckpointError as e:
        if not fallback:
            raise CheckpointError(f"{e}. Set trainer.resume_fallback=true to resume from the newest older checkpoint "
                                  "that verifies, or trainer.resume_mode=disable to start over") from None
        first = e
    for older in _previous(path):
        try:
            verify_manifest(older)
        except CheckpointError:
            continue
        log.warning("%s; resuming from %s instead (trainer.resume_fallback=true)", first, older)
        return older
    raise CheckpointError(f"{first}, and no older checkpoint in {path.parent} verifies (trainer.resume_fallback=true); "
                          "set trainer.resume_mode=disable to start over")


_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def _num_layers(keys: Iterable[str]) -> int:
    return len({m.group(1) for k in keys if (m := _LAYER.search(k))})


def state_mismatch(saved: dict[str, Any], reference: dict[str, tuple[int, ...]]) -> str | None:
    """Why the saved model state ``saved`` (name -> tensor, or its shape as a tuple) cannot fit a model whose parameters have
    the shapes ``reference`` (name -> shape): another number of decoder layers, or the first
    parameter of both with another shape; None when neither is seen.  A policy wrapped with a log Z
    head (a policy loss's hook): its ``lm.`` prefix is dropped and its ``log_z_head.*`` ignored."""
    if any(k.startswith("lm.") for k in saved):
        saved = {k[3:]: v for k, v in saved.items() if k.startswith("lm.")}
    got, want = _num_layers(saved), _num_layers(reference)
    if got != want and got and want:
        first = next(k for k in sorted(set(saved) ^ set(reference)) if _LAYER.search(k))
        where = "checkpoint" if first in saved else "model"
        return (f"the checkpoint has {got} decoder layers, the model {want} (first parameter only in the {where}: "
                f"{first!r})")
    for name, t in saved.items():
        shape = tuple(t) if isinstance(t, tuple) else tuple(getattr(t, "shape", ()))
        if name in reference and shape != tuple(reference[name]):
            return f"parameter {name!r} has shape {list(shape)} in the checkpoint, {list(reference[name])} in the model"
    return None


def restore(engine: Any, ckpt: Path, name: str, model_key: str,
            reference: dict[str, tuple[int, ...]] | None = None) -> None:
    """Load part ``name`` of ``ckpt`` into ``engine``.

    ``reference`` (parameter name -> shape of the model built from ``model_key``; HF names) is
    checked first, so a checkpoint of another architecture fails with the first mismatch named
    before the engine sees it.

    Raises:
        ConfigError: unreadable file.
        CheckpointError: a state that does not fit the model (another architecture or
            ``override_config``), naming the checkpoint, the first mismatch and ``model_key``.
    """
    state = load_part(ckpt, name)
    fix = "resume with the same model settings or set trainer.resume_mode=disable"
    model = state.get("model") if isinstance(state, dict) else None
    if reference and isinstance(model, dict) and not any("lora_" in k for k in model):
        why = state_mismatch(model, reference)
        if why is not None:
            raise CheckpointError(f"checkpoint {ckpt / name} does not fit the model built from {model_key}.*: {why}; "
                                  f"{fix}")
    try:
        engine.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError, IndexError) as e:
        why = state_mismatch(model, reference) if reference and isinstance(model, dict) else None
        detail = why or f"{e.__class__.__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        raise CheckpointError(
            f"checkpoint {ckpt / name} does not match the model built from {model_key}.* ({detail}); {fix}"
        ) from None

"""One run per run folder: a run that starts in a folder holding another run's output stops.

A run folder (``trainer.default_local_dir``) records the resolved config of the run that writes
into it as ``run_config.yaml`` (written at every start, so it also holds a resume's new values).
When a run starts in a folder that already holds rlforge output (:data:`OUTPUTS`: that file,
``metrics*.jsonl``, ``global_step_*``, the tracker file, ``trace/``, logger folders), its config is
compared with the saved one on the keys that say *which* run it is (:data:`IDENTITY`):

- the same values (or only other keys changed: the step count, the learning rate, the save and
  test frequencies, the loggers, how to resume): the same run, which resumes or restarts as before;
- another value of an :data:`IDENTITY` key: one :class:`~rlforge.errors.ConfigError` naming every
  such key (saved -> now) and the fix (another ``trainer.experiment_name`` or
  ``trainer.default_local_dir``, or ``trainer.resume_mode=disable``);
- ``trainer.resume_mode=disable``: the run starts over in a new sub-folder ``run-<N>`` (the
  smallest free N), said in one line; the earlier run's files are not touched.

The saved config compared with: with ``resume_mode=auto`` and a resumable checkpoint, that
checkpoint's ``config.yaml`` (the state the run continues; a checkpoint without one, from an older
rlforge, is left to the weight-shape checks of the resume); otherwise ``run_config.yaml``, else the
newest ``global_step_*/config.yaml``.  A folder with output but none of these (an older rlforge's
metrics only) cannot be compared and is the same error, naming what it holds.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml

from rlforge.errors import ConfigError
from rlforge.trainer.resume_config import FROZEN, Change, frozen_changes

RUN_CONFIG = "run_config.yaml"
"""The resolved config of the run that writes into the folder (rewritten at each start)."""
TRACKER = "latest_checkpointed_iteration.txt"  # = rlforge.trainer.checkpoint.TRACKER (which imports torch)
CKPT_CONFIG = "config.yaml"  # = rlforge.trainer.checkpoint.CONFIG_FILE

IDENTITY: tuple[str, ...] = FROZEN + (
    "data.train_files", "data.train_max_samples", "data.prompt_key", "data.custom_cls", "data.datagen",
    "data.builtin.difficulty", "data.builtin.train_size", "data.builtin.distribution", "data.seed",
    "data.max_prompt_length", "data.max_response_length", "data.train_batch_size", "actor_rollout_ref.rollout.n",
)
"""Keys (and sub-trees) whose values make a run another run: every resume-frozen key (the model,
tokenizer, LoRA, critic, advantage estimator, policy loss: :data:`~rlforge.trainer.resume_config.FROZEN`),
the training data (files, sample cap, prompt key, dataset class, built-in task, seed) and the batch's
shape (prompt and response lengths, prompts per step, responses per prompt).  Any other key (step
count, optimizer, frequencies, loggers, devices, how to resume) may change between starts of one run."""

_OUTPUT = re.compile(r"(metrics(\.\d+)?\.jsonl|global_step_\d+|trace|tensorboard|mlruns|wandb)")
"""Names of what a run writes into its folder, besides :data:`RUN_CONFIG` and :data:`TRACKER`."""
_CKPT = re.compile(r"global_step_\d+")


def run_outputs(folder: Path) -> list[str]:
    """The names of rlforge run output in ``folder`` (sorted; empty for a new or empty folder)."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if p.name in (RUN_CONFIG, TRACKER) or _OUTPUT.fullmatch(p.name))


def _step(p: Path) -> int:
    return int(p.name.rsplit("_", 1)[1])


def _resumable_checkpoint(folder: Path) -> Path | None:
    """The checkpoint that ``resume_mode=auto`` would resume in ``folder`` (None: none, or a broken
    tracker file, which the resume itself reports)."""
    try:
        step = (folder / TRACKER).read_text(errors="replace").strip()
    except OSError:
        return None
    ckpt = folder / f"global_step_{step}"
    return ckpt if step.isdigit() and (ckpt / "trainer_state.pt").is_file() else None


def saved_config(folder: Path, resume_mode: str) -> Path | None:
    """The file holding the config of the run in ``folder`` (see the module doc for the order);
    None when there is none to compare with."""
    ckpt = _resumable_checkpoint(folder) if resume_mode == "auto" else None
    if ckpt is not None:
        return ckpt / CKPT_CONFIG if (ckpt / CKPT_CONFIG).is_file() else None
    if (folder / RUN_CONFIG).is_file():
        return folder / RUN_CONFIG
    saved = sorted((p for p in folder.glob(f"global_step_*/{CKPT_CONFIG}") if _CKPT.fullmatch(p.parent.name)),
                   key=lambda p: _step(p.parent))
    return saved[-1] if saved else None


def identity_changes(saved_yaml: str, current_yaml: str) -> list[Change]:
    """The :data:`IDENTITY` keys whose value differs between two resolved configs (YAML); a key the
    saved config lacks (an older schema) is skipped, and ``critic.*`` when neither run trains a critic."""
    saved, current = yaml.safe_load(saved_yaml) or {}, yaml.safe_load(current_yaml) or {}
    if not isinstance(saved, dict) or not isinstance(current, dict):
        return []
    return frozen_changes(saved, current, IDENTITY)


def _fix(folder: Path) -> str:
    return (f"Give this run its own folder (a new trainer.experiment_name=... or trainer.default_local_dir=...), "
            f"or set trainer.resume_mode=disable to start over in a new sub-folder of {folder}; "
            "the earlier run's files are left as they are")


def fresh_subfolder(folder: Path) -> Path:
    """Create and return ``folder/run-<N>`` for the smallest N >= 1 not taken (atomically: of two
    runs racing for one N, one gets the next)."""
    n = 1
    while True:
        sub = folder / f"run-{n}"
        try:
            sub.mkdir()
            return sub
        except FileExistsError:
            n += 1


def check_run_folder(folder: str | Path, current_yaml: str, resume_mode: str) -> Path:
    """Where this run writes: ``folder`` itself, or with ``resume_mode=disable`` in a folder holding
    output, a new ``run-<N>`` sub-folder of it (created; one line says so).

    Args:
        folder: ``trainer.default_local_dir`` (held by this run's lock).
        current_yaml: this run's resolved config (``format_config``).
        resume_mode: ``trainer.resume_mode``.

    Raises:
        ConfigError: the folder holds another run's output: its saved config differs in
            :data:`IDENTITY` keys (each named, saved -> now), or it cannot be compared.
    """
    folder = Path(folder)
    outputs = run_outputs(folder)
    if not outputs:
        return folder
    if resume_mode == "disable":
        sub = fresh_subfolder(folder)
        print(f"rlforge: {folder} holds an earlier run's output; this run starts over in {sub} "
              f"(trainer.resume_mode=disable; resume it later with trainer.default_local_dir={sub})", flush=True)
        return sub
    path = saved_config(folder, resume_mode)
    if path is None:
        if resume_mode == "auto" and _resumable_checkpoint(folder) is not None:
            return folder  # an older checkpoint without config.yaml: the resume checks its weights' shapes
        shown = ", ".join(outputs[:4]) + (", ..." if len(outputs) > 4 else "")
        raise ConfigError(f"trainer.default_local_dir={folder} holds an earlier run's output ({shown}) but no "
                          f"{RUN_CONFIG} or checkpoint config.yaml saying which run it was (an older rlforge), so "
                          f"this run cannot be checked against it. {_fix(folder)}")
    try:
        changes = identity_changes(path.read_text(errors="replace"), current_yaml)
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"trainer.default_local_dir={folder}: {path} is unreadable ({e.__class__.__name__}), so "
                          f"this run cannot be checked against the run saved there. {_fix(folder)}") from None
    if changes:
        raise ConfigError(f"trainer.default_local_dir={folder} holds another run (its config {path}); this run "
                          f"differs in {'; '.join(str(c) for c in changes)} (saved -> now). {_fix(folder)}")
    return folder


def record_config(folder: str | Path, config_yaml: str) -> Path:
    """Write ``config_yaml`` as ``folder/run_config.yaml`` (atomically: a temporary file renamed)."""
    path = Path(folder) / RUN_CONFIG
    tmp = path.with_name(f".{RUN_CONFIG}.tmp-{os.getpid()}")
    tmp.write_text(config_yaml)
    os.replace(tmp, path)
    return path


def interrupted_message(folder: str | Path, step: int, save_freq: int, save_contents: list[str]) -> str:
    """What a run stopped by Ctrl-C at ``step`` leaves to resume, in one line: the checkpoint that the
    same command resumes from, or that nothing resumable was saved and which keys decide it
    (``trainer.save_freq``, ``actor_rollout_ref.actor.checkpoint.save_contents``)."""
    folder = Path(folder)
    ckpt = _resumable_checkpoint(folder)
    if ckpt is not None:
        return (f"rlforge: interrupted during step {step}; the same command resumes from {ckpt} "
                f"(step {_step(ckpt)}), and the steps after it are lost")
    parts = set(save_contents or ())
    if save_freq <= 0:
        why = f"trainer.save_freq={save_freq} saves only at the last step"
    elif not parts & {"model", "optimizer", "extra"}:
        why = (f"actor_rollout_ref.actor.checkpoint.save_contents={sorted(parts)} writes only the Hugging Face "
               "folder (add model, optimizer and extra to resume)")
    else:
        why = f"the first save comes at step {save_freq} (trainer.save_freq={save_freq})"
    return f"rlforge: interrupted during step {step}; nothing resumable was saved in {folder}: {why}"

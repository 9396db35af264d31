"""Build an :class:`RLDataset` from ``data.*`` config values (verl's keys).

``files`` entries are parquet/jsonl paths or ``builtin:<task>`` (e.g. ``builtin:arithmetic``),
which generates ``data.builtin.train_size`` / ``val_size`` rows at ``data.builtin.difficulty``
(one level, or a list of levels to mix) from ``data.seed``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from rlforge.data.dataset import RLDataset
from rlforge.data.readers import as_file_list, read_rows
from rlforge.data.tasks import BUILTIN_TASKS
from rlforge.errors import ConfigError, DataError

DEFAULT_SEED = 1  # verl's dataloader uses seed 1 when data.seed is unset


def _builtin_rows(name: str, data_cfg: Any, split: str) -> list[dict[str, Any]]:
    builtin = data_cfg.builtin
    size = builtin.train_size if split == "train" else builtin.val_size
    seed = data_cfg.seed if data_cfg.seed is not None else DEFAULT_SEED
    task = BUILTIN_TASKS.get(name)
    level = builtin.difficulty
    difficulty = level if isinstance(level, int) else list(level)  # one level, or a list (an OmegaConf ListConfig)
    return task(split=split, size=int(size), difficulty=difficulty, seed=int(seed), builtin=builtin)


def _load_entries(
    files: str | Sequence[str], data_cfg: Any, split: str
) -> list[tuple[str, list[dict[str, Any]], list[str]]]:
    """``(entry, rows, origins)`` for each file or ``builtin:<task>`` entry, in order (see :func:`load_rows`)."""
    key = "data.train_files" if split == "train" else "data.val_files"
    out: list[tuple[str, list[dict[str, Any]], list[str]]] = []
    for entry in as_file_list(files, key):
        if entry.startswith("builtin:"):
            name = entry.split(":", 1)[1]
            new = _builtin_rows(name, data_cfg, split)
            out.append((entry, new, [f"{entry} ({split}) row {i}" for i in range(len(new))]))
        else:
            if not os.path.exists(entry):  # name the key, and where a relative path was looked for
                where = "" if os.path.isabs(entry) else f" (relative to the current folder {os.getcwd()})"
                hint = (
                    "; make it with `rlforge data gsm8k --src DIR --out FOLDER` (docs/gsm8k.md)"
                    if "gsm8k" in entry.lower()
                    else ""
                )
                raise DataError(f"{key}: data file not found: {entry}{where}{hint}")
            new, new_origins = read_rows([entry])
            out.append((entry, new, new_origins))
    return out


def load_rows(
    files: str | Sequence[str], data_cfg: Any, split: str
) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows and their origins (``"<file> row <i>"``) from files and built-in tasks, in order.

    Raises:
        DataError: missing/unreadable files (see :mod:`rlforge.data.readers`).
        ConfigError: unknown ``builtin:<task>`` or bad ``data.builtin.*`` values.
    """
    rows: list[dict[str, Any]] = []
    origins: list[str] = []
    for _, new, new_origins in _load_entries(files, data_cfg, split):
        rows.extend(new)
        origins.extend(new_origins)
    return rows, origins


def empty_dataset_error(key: str, counts: Sequence[tuple[str, int]], num_used: int, dataset: RLDataset,
                        data_cfg: Any) -> DataError:
    """The error for a dataset left with no prompts: names the files with their row counts, and
    the filter that dropped the rows (``data.filter_overlong_prompts``), with rows read and kept.

    Args:
        key: ``data.train_files`` or ``data.val_files``.
        counts: ``(file or builtin entry, rows read)`` per entry.
        num_used: rows handed to the dataset (after ``data.<split>_max_samples``).
        dataset: the (empty) dataset, for its ``num_filtered``.
    """
    read = sum(n for _, n in counts)
    files = ", ".join(f"{name} ({n} rows)" for name, n in counts)
    if read == 0:
        return DataError(f"{key}: no prompts: {files}; rows read 0, kept 0. Give a file with rows")
    if dataset.num_filtered:
        return DataError(
            f"{key}: no prompts left: {files}; rows read {read}, kept 0: all {dataset.num_filtered} were longer "
            f"than data.max_prompt_length={data_cfg.max_prompt_length} tokens and data.filter_overlong_prompts=True "
            "dropped them. Raise data.max_prompt_length, or set data.filter_overlong_prompts=False with "
            "data.truncation=left"
        )
    return DataError(f"{key}: no prompts left: {files}; rows read {read}, used {num_used}, kept 0")


def load_rl_dataset(
    files: str | Sequence[str],
    tokenizer: Any,
    data_cfg: Any,
    split: str = "train",
    tools: list[dict[str, Any]] | None = None,
) -> RLDataset:
    """Read ``files`` and tokenize them into an :class:`RLDataset`.

    Args:
        files: ``data.train_files`` or ``data.val_files`` (one path, a list, or ``builtin:<task>``).
        tokenizer: Hugging Face tokenizer with a chat template.
        data_cfg: object with verl's ``data.*`` attributes: ``prompt_key``,
            ``max_prompt_length``, ``truncation``, ``filter_overlong_prompts``, ``seed``,
            ``builtin.{difficulty, train_size, val_size}`` and, where present,
            ``apply_chat_template_kwargs`` (extra keywords for the chat template).
        split: ``"train"`` or ``"val"``; picks the built-in split and the key named in errors.
            ``data.<split>_max_samples`` > 0 keeps only the first that many rows (before tokenizing).
        tools: OpenAI function schemas to render into the prompts (see :class:`RLDataset`); None = none.

    Raises:
        DataError, ConfigError: see :func:`load_rows` and :class:`RLDataset`; DataError when no prompt
            is left (:func:`empty_dataset_error`: the files with their row counts and the filter).
    """
    if split not in ("train", "val"):
        raise ConfigError(f"split must be 'train' or 'val', got {split!r}")
    key = "data.train_files" if split == "train" else "data.val_files"
    entries = _load_entries(files, data_cfg, split)
    rows = [r for _, new, _ in entries for r in new]
    origins = [o for _, _, new_origins in entries for o in new_origins]
    limit = int(getattr(data_cfg, f"{split}_max_samples", -1) or -1)
    if limit > 0:  # data.train_max_samples / data.val_max_samples: the first N rows
        rows, origins = rows[:limit], origins[:limit]
    dataset = RLDataset(
        rows,
        tokenizer,
        max_prompt_length=int(data_cfg.max_prompt_length),
        truncation=str(data_cfg.truncation),
        filter_overlong_prompts=bool(data_cfg.filter_overlong_prompts),
        prompt_key=str(data_cfg.prompt_key),
        source_name=key,
        origins=origins,
        tools=tools,
        chat_template_kwargs=dict(getattr(data_cfg, "apply_chat_template_kwargs", None) or {}),
    )
    if len(dataset) == 0:
        raise empty_dataset_error(key, [(e, len(new)) for e, new, _ in entries], len(rows), dataset, data_cfg)
    return dataset

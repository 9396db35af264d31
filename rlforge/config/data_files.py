"""A missing local data file, found before torch is imported (``rlforge train`` checks it right after the config).

The data loader reports the same mistake (:mod:`rlforge.data.load`), but only once torch and the trainer are
built: tens of seconds on a busy machine.  This check uses ``os`` only, so the config package stays torch-free.
"""

from __future__ import annotations

import os
from typing import Any

from rlforge.errors import DataError


def _entries(files: Any) -> list[str]:
    if files is None:
        return []
    return [files] if isinstance(files, str) else [str(f) for f in files]


_MAGIC = b"PAR1"  # a parquet file starts and ends with these four bytes (the format's spec)


def _check_parquet_magic(key: str, path: str) -> None:
    """Raise when a ``.parquet`` file lacks the parquet magic bytes at its start and end (another format, or cut
    short); the loader's pyarrow read gives the details of anything subtler."""
    if not path.endswith(".parquet") or not os.path.isfile(path):
        return
    try:
        with open(path, "rb") as f:
            head = f.read(4)
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - 4, 0))
            tail = f.read(4)
    except OSError as e:
        raise DataError(f"{key}: cannot read data file {path} ({e.strerror or e})") from None
    if head != _MAGIC or tail != _MAGIC or size < 12:
        what = "empty" if size == 0 else "cut short" if head == _MAGIC else "not in parquet format"
        raise DataError(f"{key}: data file {path} is not a parquet file ({what}: a parquet file starts and ends "
                        f"with 'PAR1'); give a .parquet or .jsonl file")


def check_data_files(cfg: Any) -> None:
    """Raise for the first ``data.train_files`` / ``data.val_files`` entry that is a local path that does not exist.

    ``builtin:<task>`` entries and URLs (``hdfs://...``, anything with ``://``) are left to the loader.

    Raises:
        DataError: ``<key>: data file not found: <path>`` (where a relative path was looked for; for a GSM8K
            path, the command that makes it), the loader's message; or a ``.parquet`` file without parquet's
            magic bytes (another format, empty, cut short).
    """
    for key, files in (("data.train_files", cfg.data.train_files), ("data.val_files", cfg.data.val_files)):
        for entry in _entries(files):
            if entry.startswith("builtin:") or "://" in entry:
                continue
            path = os.path.expanduser(entry)
            if os.path.exists(path):
                _check_parquet_magic(key, path)
                continue
            where = "" if os.path.isabs(path) else f" (relative to the current folder {os.getcwd()})"
            hint = "; make it with `rlforge data gsm8k --src DIR --out FOLDER` (docs/gsm8k.md)" if "gsm8k" in path.lower() else ""
            raise DataError(f"{key}: data file not found: {path}{where}{hint}")

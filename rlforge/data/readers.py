"""Read verl-format rows from parquet and jsonl files.

A verl row is a dict with ``data_source`` (str), ``prompt`` (list of chat messages
``{role, content}``), ``ability`` (str), ``reward_model`` (``{style, ground_truth}``) and
``extra_info`` (dict).  This module only reads files; the rows are checked by
:class:`rlforge.data.dataset.RLDataset`, which knows the configured ``prompt_key``.

Float32 parquet columns are read as the decimals they show (:func:`float32_as_written`), so a
float32 ground truth ``0.1`` is ``"0.1"`` for the reward, not ``"0.10000000149011612"``.

Every row comes back with an *origin* string (``"<file> row <i>"``) so that later errors
can name the file and the row index.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from rlforge.errors import DataError

SUPPORTED_SUFFIXES = (".parquet", ".jsonl", ".json")


def as_file_list(files: str | Sequence[str] | None, key: str = "data.train_files") -> list[str]:
    """Normalise ``files`` (one path or a list of paths, as verl accepts) to a list of strings.

    ``~`` is expanded.  Entries of the form ``builtin:<task>`` are kept as they are.

    Raises:
        DataError: if ``files`` is empty or ``None``; the message names ``key``.
    """
    if files is None:
        raise DataError(f"{key} is not set; give a parquet/jsonl path, a list of paths, or builtin:<task>")
    paths = [files] if isinstance(files, str) else [str(f) for f in files]
    if not paths:
        raise DataError(f"{key} is an empty list; give at least one parquet/jsonl path or builtin:<task>")
    return [p if p.startswith("builtin:") else os.path.expanduser(p) for p in paths]


def _float32_to(t: Any, to: Any) -> Any:
    """Arrow type ``t`` with every float32 in it (also in structs and lists) replaced by ``to``."""
    import pyarrow as pa

    if pa.types.is_float32(t):
        return to
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(_float32_to(t.field(i).type, to)) for i in range(t.num_fields)])
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(_float32_to(t.value_type, to)))
    if pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(_float32_to(t.value_type, to)))
    return t


def float32_as_written(table: Any) -> Any:
    """``table`` (a ``pyarrow.Table``) with its float32 values, top-level or nested in structs and
    lists, read as the float64 of their shortest float32 repr: a float32 ``0.1`` becomes ``0.1``, not
    ``0.10000000149011612`` (what a plain widening gives, and what ``str()`` of a ground truth then
    compared against the model's ``0.1``).  Arrow's float-to-string cast writes that shortest repr."""
    import pyarrow as pa

    schema = table.schema
    widened = pa.schema([f.with_type(_float32_to(f.type, pa.float64())) for f in schema], metadata=schema.metadata)
    if widened.equals(schema):
        return table
    as_text = pa.schema([f.with_type(_float32_to(f.type, pa.string())) for f in schema], metadata=schema.metadata)
    return table.cast(as_text).cast(widened)


def _read_parquet(path: str) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for corrupt files
        raise DataError(f"cannot read parquet file {path}: {e}") from e
    return float32_as_written(table).to_pylist()


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    try:
        with open(path, encoding="utf-8") as f:
            for line_no, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path} line {line_no} is not valid JSON: {e.msg}") from e
                if not isinstance(row, dict):
                    raise DataError(
                        f"{path} line {line_no} is a {type(row).__name__}, expected a JSON object"
                    )
                rows.append(row)
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read jsonl file {path}: {e}") from e
    return rows


def _read_json(path: str) -> list[dict[str, Any]]:
    """A ``.json`` file holds either a JSON array of rows or one JSON object per line."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read json file {path}: {e}") from e
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} is not valid JSON: {e}") from e
        bad = [i for i, r in enumerate(rows) if not isinstance(r, dict)]
        if bad:
            raise DataError(f"{path} row {bad[0]} is not a JSON object")
        return rows
    return _read_jsonl(path)


def read_file(path: str) -> list[dict[str, Any]]:
    """Read all rows of one parquet (``.parquet``) or JSON-lines (``.jsonl``/``.json``) file.

    Raises:
        DataError: if the file is missing, has an unsupported suffix, or cannot be parsed;
            the message names the file (and the line, for bad JSON).
    """
    if os.path.isdir(path):
        raise DataError(f"data file {path} is a directory; give the .parquet/.jsonl file(s) inside it")
    if not os.path.isfile(path):
        raise DataError(f"data file not found: {path}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".parquet":
        return _read_parquet(path)
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        return _read_json(path)
    raise DataError(f"unsupported data file {path}: expected one of {', '.join(SUPPORTED_SUFFIXES)}")


def read_rows(paths: Sequence[str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Read and concatenate the rows of several files.

    Returns:
        ``(rows, origins)`` where ``origins[i]`` is ``"<file> row <j>"`` (j counts from 0
        within that file).

    Raises:
        DataError: see :func:`read_file`.
    """
    rows: list[dict[str, Any]] = []
    origins: list[str] = []
    for path in paths:
        file_rows = read_file(path)
        rows.extend(file_rows)
        origins.extend(f"{path} row {j}" for j in range(len(file_rows)))
    return rows, origins

"""Convert the official GSM8K files to verl's parquet format.

Source: verl's ``examples/data_preprocess/gsm8k.py``.  Input: ``train.jsonl`` and
``test.jsonl`` from https://github.com/openai/grade-school-math, one
``{"question": str, "answer": str}`` object per line, the answer ending in ``#### <number>``.
Output: ``train.parquet`` and ``test.parquet`` with the rows verl writes:

* ``data_source``: ``"openai/gsm8k"``
* ``prompt``: one user message, ``question + " " + INSTRUCTION``
* ``ability``: ``"math"``
* ``reward_model``: ``{"style": "rule", "ground_truth": <number after ####, commas removed>}``
* ``extra_info``: ``{"split", "index", "question", "answer"}`` (``answer`` is the full reference)

Scored by :func:`rlforge.rewards.gsm8k.compute_score`.
"""

from __future__ import annotations

import os
import re
from typing import Any

from rlforge.data.readers import read_file
from rlforge.errors import DataError

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
_ANSWER_RE = re.compile(r"#### (\-?[0-9\.\,]+)")


def extract_reference_answer(answer: str) -> str | None:
    """The number after ``#### `` in a GSM8K reference answer, commas removed (``"1,234"`` → ``"1234"``)."""
    m = _ANSWER_RE.search(answer)
    return m.group(1).replace(",", "") if m else None


def convert_row(raw: dict[str, Any], split: str, index: int, origin: str) -> dict[str, Any]:
    """One official GSM8K record → one verl row.

    Raises:
        DataError: if ``question``/``answer`` is missing or the answer has no ``#### <number>``.
    """
    question, answer = raw.get("question"), raw.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str):
        raise DataError(f"{origin} needs string fields 'question' and 'answer'")
    solution = extract_reference_answer(answer)
    if solution is None:
        raise DataError(f"{origin}: answer has no '#### <number>' final answer")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {"split": split, "index": index, "question": question, "answer": answer},
    }


def convert_gsm8k(src_dir: str, out_dir: str) -> dict[str, int]:
    """Write ``out_dir/{train,test}.parquet`` from ``src_dir/{train,test}.jsonl``.

    Returns:
        rows written per split, e.g. ``{"train": 7473, "test": 1319}``.

    Raises:
        DataError: if a source file is missing or a record is malformed (names file and row).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    src_dir, out_dir = os.path.expanduser(src_dir), os.path.expanduser(out_dir)
    sources = {split: os.path.join(src_dir, f"{split}.jsonl") for split in SPLITS}
    missing = [p for p in sources.values() if not os.path.isfile(p)]
    if missing:
        raise DataError(
            f"GSM8K source file(s) not found: {', '.join(missing)}; --src must hold the official "
            "train.jsonl and test.jsonl (github.com/openai/grade-school-math, grade_school_math/data)"
        )
    converted = {
        split: [convert_row(raw, split, i, f"{path} row {i}") for i, raw in enumerate(read_file(path))]
        for split, path in sources.items()
    }
    empty = [sources[split] for split, rows in converted.items() if not rows]
    if empty:
        raise DataError(f"GSM8K source file(s) have no rows: {', '.join(empty)}")
    try:
        os.makedirs(out_dir, exist_ok=True)
        counts: dict[str, int] = {}
        for split, rows in converted.items():
            pq.write_table(pa.Table.from_pylist(rows), os.path.join(out_dir, f"{split}.parquet"))
            counts[split] = len(rows)
    except OSError as e:
        raise DataError(f"cannot write to --out {out_dir}: {e.strerror or e}") from None
    return counts

"""Convert GSM8K (from the Hub or a local copy) to verl's parquet format.

Source: verl's ``examples/data_preprocess/gsm8k.py``.  Input: GSM8K's records,
``{"question": str, "answer": str}``, the answer ending in ``#### <number>``: fetched from the Hub
(``openai/gsm8k``, ``main``) through ``datasets``, or read from a local copy such as the official
``train.jsonl``/``test.jsonl`` of https://github.com/openai/grade-school-math
(:mod:`rlforge.data.gsm8k_source`).
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

from rlforge.data.gsm8k_source import fetch_hub, read_local
from rlforge.errors import DataError

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
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


def convert_gsm8k(src_dir: str | None, out_dir: str) -> dict[str, int]:
    """Write ``out_dir/{train,test}.parquet`` from GSM8K: the folder ``src_dir``, or the Hub when ``None``.

    ``src_dir`` holds the official ``train.jsonl``/``test.jsonl`` or a parquet/``datasets`` copy;
    ``None`` fetches ``openai/gsm8k`` through ``datasets`` (:mod:`rlforge.data.gsm8k_source`).  Both give
    the same rows.  Nothing is written unless every record converts.

    Returns:
        rows written per split, e.g. ``{"train": 7473, "test": 1319}``.

    Raises:
        DataError: if the source is missing or unreachable, a record is malformed (names file and row),
            or ``out_dir`` cannot be written.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = fetch_hub() if src_dir is None else read_local(src_dir)
    converted = {
        split: [convert_row(raw, split, i, origin) for i, (raw, origin) in enumerate(rows)]
        for split, rows in records.items()
    }
    out_dir = os.path.expanduser(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        counts: dict[str, int] = {}
        for split, rows in converted.items():
            pq.write_table(pa.Table.from_pylist(rows), os.path.join(out_dir, f"{split}.parquet"))
            counts[split] = len(rows)
    except OSError as e:
        raise DataError(f"cannot write to --out {out_dir}: {e.strerror or e}") from None
    return counts

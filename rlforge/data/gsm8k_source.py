"""Where ``rlforge data gsm8k`` reads GSM8K from: a local copy (``--src``) or the Hugging Face Hub.

Without ``--src``, :func:`fetch_hub` loads ``openai/gsm8k`` (config ``main``) through the optional
``datasets`` package, as verl's ``examples/data_preprocess/gsm8k.py`` does
(``pip install datasets``, or ``pip install -e ".[data]"``).  With ``--src``, :func:`read_local`
reads one of these layouts of a folder:

* the official files: ``train.jsonl`` and ``test.jsonl`` (github.com/openai/grade-school-math);
* parquet: ``train.parquet``/``test.parquet``, or the Hub repository's shards
  (``main/train-00000-of-00001.parquet``, as ``hf download openai/gsm8k --repo-type dataset`` leaves them);
* a ``datasets`` save (``DatasetDict.save_to_disk``, a folder with ``dataset_dict.json``; needs ``datasets``).

Both return the raw records, ``{"question": str, "answer": str}``, per split, each with an origin
string (``"<file> row <i>"``) for error messages; :mod:`rlforge.data.gsm8k` converts them.
"""

from __future__ import annotations

import glob
import os
from importlib.util import find_spec
from typing import Any

from rlforge.data.readers import read_file
from rlforge.errors import DataError

HUB_ID = "openai/gsm8k"
HUB_CONFIG = "main"
SPLITS = ("train", "test")
_SRC_HINT = ("pass --src DIR, a folder with GSM8K's train.jsonl and test.jsonl "
             "(github.com/openai/grade-school-math, grade_school_math/data) or a local parquet/`datasets` copy")

Records = dict[str, list[tuple[dict[str, Any], str]]]  # split -> [(raw record, origin)]


def _require_datasets(why: str, instead: str = _SRC_HINT) -> Any:
    """The ``datasets`` module, or one DataError saying how to install it (``why``: what needs it;
    ``instead``: the way around it)."""
    if find_spec("datasets") is None:
        raise DataError(f"{why} needs the `datasets` package, which is not installed: pip install datasets "
                        f"(or pip install -e \".[data]\"), or {instead}")
    import datasets

    return datasets


def _is_offline_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception in its chain) says the Hub could not be reached."""
    kinds: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)
    try:
        import httpx

        kinds = (*kinds, httpx.TransportError)
    except ImportError:  # pragma: no cover - huggingface_hub>=1.0 depends on httpx
        pass
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, kinds):
            return True
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return False


def _from_dataset_dict(dsd: Any, name: str) -> Records:
    """Records of the ``train``/``test`` splits of a ``datasets.DatasetDict`` (or a dict of row lists)."""
    missing = [s for s in SPLITS if s not in dsd]
    if missing:
        raise DataError(f"{name} has no split(s) {', '.join(missing)} (it has: {', '.join(map(str, dsd))})")
    return {s: [(dict(raw), f"{name} {s} row {i}") for i, raw in enumerate(dsd[s])] for s in SPLITS}


def fetch_hub() -> Records:
    """GSM8K's ``main`` config from the Hub through ``datasets.load_dataset`` (cached by ``datasets``).

    Raises:
        DataError: ``datasets`` is not installed; offline (``HF_HUB_OFFLINE=1``, no network) and
            not in the ``datasets`` cache; or the load failed otherwise. Each message names ``--src``.
    """
    datasets = _require_datasets(f"rlforge data gsm8k without --src (it fetches {HUB_ID} from the Hub)")
    try:
        dsd = datasets.load_dataset(HUB_ID, HUB_CONFIG)
    except Exception as e:  # datasets/huggingface_hub raise many types for a failed download
        reason = f"{type(e).__name__}: {e}".splitlines()[0]
        if _is_offline_error(e):
            raise DataError(f"cannot fetch {HUB_ID}: offline (or the Hub unreachable) and not in the `datasets` "
                            f"cache ({reason}); {_SRC_HINT}") from None
        raise DataError(f"cannot fetch {HUB_ID} through `datasets` ({reason}); {_SRC_HINT}") from None
    return _from_dataset_dict(dsd, f"{HUB_ID} ({HUB_CONFIG})")


def _split_files(src: str, split: str) -> list[str]:
    """The first layout of ``split`` found in ``src``: its jsonl, its parquet, or its parquet shards."""
    for pattern in (f"{split}.jsonl", f"{split}.parquet", f"{split}-*.parquet", f"{HUB_CONFIG}/{split}-*.parquet"):
        found = sorted(glob.glob(os.path.join(glob.escape(src), pattern)))
        if found:
            return found
    return []


def read_local(src: str) -> Records:
    """GSM8K's records from the folder ``src`` (layouts: see the module docstring).

    Raises:
        DataError: ``src`` is not a folder, a split is missing (the message lists the names looked for),
            a file cannot be read, or a ``datasets`` save is given without ``datasets`` installed.
    """
    src = os.path.expanduser(src)
    if not os.path.isdir(src):
        raise DataError(f"--src {src}: no such folder; it must hold GSM8K's train.jsonl and test.jsonl "
                        "(or a parquet/`datasets` copy)")
    if os.path.isfile(os.path.join(src, "dataset_dict.json")):
        datasets = _require_datasets(f"--src {src} (a `datasets` save, with dataset_dict.json)",
                                     "give --src the official train.jsonl/test.jsonl or parquet files")
        return _from_dataset_dict(datasets.load_from_disk(src), src)
    files = {split: _split_files(src, split) for split in SPLITS}
    missing = [split for split, found in files.items() if not found]
    if missing:
        looked = ", ".join(f"{s}.jsonl, {s}.parquet or {HUB_CONFIG}/{s}-*.parquet" for s in missing)
        raise DataError(f"GSM8K source file(s) not found in --src {src}: looked for {looked}; it must hold the "
                        "official train.jsonl and test.jsonl (github.com/openai/grade-school-math, "
                        "grade_school_math/data) or a parquet/`datasets` copy")
    records: Records = {}
    for split, paths in files.items():
        rows = [(raw, f"{path} row {i}") for path in paths for i, raw in enumerate(read_file(path))]
        if not rows:
            raise DataError(f"GSM8K source file(s) have no rows: {', '.join(paths)}")
        records[split] = rows
    return records

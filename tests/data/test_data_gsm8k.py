"""GSM8K conversion to verl's parquet format: from a local copy (``--src``) and from the Hub through a fake
``datasets.load_dataset`` (no network), with the same rows; on the official files when present."""

from __future__ import annotations

import importlib.machinery
import json
import os
import sys
import types

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlforge.data import convert_gsm8k
from rlforge.data.gsm8k import INSTRUCTION, extract_reference_answer
from rlforge.errors import DataError

SRC = "/work/shared/data/gsm8k"
HAS_SRC = os.path.isfile(f"{SRC}/train.jsonl") and os.path.isfile(f"{SRC}/test.jsonl")
# a few GSM8K-style records, written by hand: a thousands comma, a negative and a decimal answer
RECORDS = {
    "train": [
        {"question": "Tom has 3 apples and buys 4 more. How many?", "answer": "3 + 4 = <<3+4=7>>7\n#### 7"},
        {"question": "A car costs $1,200 more than $800. Price?", "answer": "800 + 1,200 = 2,000\n#### 2,000"},
    ],
    "test": [
        {"question": "It is 2 degrees; it drops 5. Temperature?", "answer": "2 - 5 = -3\n#### -3"},
        {"question": "Half of 5?", "answer": "5 / 2 = 2.5\n#### 2.5"},
        {"question": "Sam has 10 pens and gives 4 away. Left?", "answer": "10 - 4 = 6\n#### 6"},
    ],
}


def fake_datasets(monkeypatch, load_dataset) -> list[tuple]:
    """Install a fake ``datasets`` module whose ``load_dataset`` is ``load_dataset``; returns its calls."""
    calls: list[tuple] = []
    mod = types.ModuleType("datasets")
    mod.__spec__ = importlib.machinery.ModuleSpec("datasets", None)

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return load_dataset(*args, **kwargs)

    mod.load_dataset = record
    monkeypatch.setitem(sys.modules, "datasets", mod)
    return calls


def write_jsonl(folder, records) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in records.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def rows_of(folder) -> dict[str, list[dict]]:
    return {split: pq.read_table(str(folder / f"{split}.parquet")).to_pylist() for split in ("train", "test")}


def test_extract_reference_answer() -> None:
    assert extract_reference_answer("so 3 + 4 = 7\n#### 7") == "7"
    assert extract_reference_answer("#### 1,234,567") == "1234567"
    assert extract_reference_answer("#### -3") == "-3"
    assert extract_reference_answer("no marker") is None


def test_missing_source(tmp_path) -> None:
    with pytest.raises(DataError, match="train.jsonl"):
        convert_gsm8k(str(tmp_path), str(tmp_path / "out"))


def test_malformed_record(tmp_path) -> None:
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "no final answer"}) + "\n")
    (tmp_path / "test.jsonl").write_text(json.dumps({"question": "q", "answer": "#### 1"}) + "\n")
    with pytest.raises(DataError, match="train.jsonl row 0"):
        convert_gsm8k(str(tmp_path), str(tmp_path / "out"))


def test_small_conversion(tmp_path) -> None:
    rec = {"question": "How many?", "answer": "It is 1,000 + 200 = <<1000+200=1200>>1,200\n#### 1,200"}
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text(json.dumps(rec) + "\n")
    assert convert_gsm8k(str(tmp_path), str(tmp_path / "out")) == {"train": 1, "test": 1}
    row = pq.read_table(str(tmp_path / "out" / "test.parquet")).to_pylist()[0]
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": "How many? " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "1200"},
        "extra_info": {"split": "test", "index": 0, "question": "How many?", "answer": rec["answer"]},
    }
    assert INSTRUCTION == 'Let\'s think step by step and output the final answer after "####".'


def test_hub_and_src_give_the_same_rows(tmp_path, monkeypatch) -> None:
    """Without --src: openai/gsm8k "main" through datasets.load_dataset (faked); the rows equal --src's."""
    calls = fake_datasets(monkeypatch, lambda *a, **k: {s: list(rows) for s, rows in RECORDS.items()})
    assert convert_gsm8k(None, str(tmp_path / "hub")) == {"train": 2, "test": 3}
    assert calls == [(("openai/gsm8k", "main"), {})]
    assert convert_gsm8k(write_jsonl(tmp_path / "src", RECORDS), str(tmp_path / "local")) == {"train": 2, "test": 3}
    hub, local = rows_of(tmp_path / "hub"), rows_of(tmp_path / "local")
    assert hub == local
    assert [r["reward_model"]["ground_truth"] for r in hub["train"] + hub["test"]] == ["7", "2000", "-3", "2.5", "6"]
    q = RECORDS["train"][1]["question"]
    assert hub["train"][1] == {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": q + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "2000"},
        "extra_info": {"split": "train", "index": 1, "question": q, "answer": RECORDS["train"][1]["answer"]},
    }


def test_src_parquet_copy_of_the_hub_repository(tmp_path) -> None:
    """--src may be a download of the Hub repository (main/<split>-00000-of-00001.parquet): the same rows."""
    (tmp_path / "hub" / "main").mkdir(parents=True)
    for split, rows in RECORDS.items():
        pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "hub" / "main" / f"{split}-00000-of-00001.parquet"))
    convert_gsm8k(str(tmp_path / "hub"), str(tmp_path / "a"))
    convert_gsm8k(write_jsonl(tmp_path / "src", RECORDS), str(tmp_path / "b"))
    assert rows_of(tmp_path / "a") == rows_of(tmp_path / "b")


def test_src_datasets_save(tmp_path) -> None:
    """--src may be a ``DatasetDict.save_to_disk`` folder (needs datasets)."""
    datasets = pytest.importorskip("datasets", reason="the optional `datasets` package is not installed")
    datasets.DatasetDict({s: datasets.Dataset.from_list(r) for s, r in RECORDS.items()}).save_to_disk(
        str(tmp_path / "saved"))
    convert_gsm8k(str(tmp_path / "saved"), str(tmp_path / "a"))
    convert_gsm8k(write_jsonl(tmp_path / "src", RECORDS), str(tmp_path / "b"))
    assert rows_of(tmp_path / "a") == rows_of(tmp_path / "b")


def test_without_datasets_installed(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # find_spec -> None, as when it is not installed
    with pytest.raises(DataError, match="pip install datasets") as e:
        convert_gsm8k(None, str(tmp_path / "out"))
    assert "--src" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def _offline(*args, **kwargs):
    """What datasets 5 raises offline with nothing cached."""
    try:
        raise FileNotFoundError("Dataset openai/gsm8k is not cached in None")
    except FileNotFoundError as e:
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled)") from e


def test_offline_without_src(tmp_path, monkeypatch) -> None:
    fake_datasets(monkeypatch, _offline)
    with pytest.raises(DataError, match="offline") as e:
        convert_gsm8k(None, str(tmp_path / "out"))
    assert "--src DIR" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "out").exists()


def test_other_fetch_failure_names_it_and_src(tmp_path, monkeypatch) -> None:
    def gated(*args, **kwargs):
        raise ValueError("Config name is missing.\nPlease pick one among the available configs")

    fake_datasets(monkeypatch, gated)
    with pytest.raises(DataError, match="ValueError: Config name is missing") as e:
        convert_gsm8k(None, str(tmp_path / "out"))
    assert "offline" not in str(e.value) and "--src DIR" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.skipif(not HAS_SRC, reason=f"official GSM8K files not found in {SRC}")
def test_official_gsm8k_hub_and_src_same_rows(tmp_path, monkeypatch) -> None:
    """The Hub path (faked with official records, as openai/gsm8k holds them) and --src write the same rows:
    the first 300 records of each official file (a quick test; test_official_gsm8k converts them all)."""
    records = {}
    for split in ("train", "test"):
        with open(f"{SRC}/{split}.jsonl", encoding="utf-8") as f:
            records[split] = [json.loads(next(f)) for _ in range(300)]
    fake_datasets(monkeypatch, lambda *a, **k: records)
    convert_gsm8k(None, str(tmp_path / "hub"))
    convert_gsm8k(write_jsonl(tmp_path / "src", records), str(tmp_path / "src_out"))
    hub = rows_of(tmp_path / "hub")
    assert hub == rows_of(tmp_path / "src_out")
    assert hub["train"][0]["reward_model"]["ground_truth"] == "72" and len(hub["test"]) == 300


@pytest.mark.skipif(not HAS_SRC, reason=f"official GSM8K files not found in {SRC}")
def test_official_gsm8k(tmp_path, smol_tokenizer) -> None:
    counts = convert_gsm8k(SRC, str(tmp_path))
    assert counts == {"train": 7473, "test": 1319}
    train = pq.read_table(str(tmp_path / "train.parquet")).to_pylist()
    assert len(train) == 7473
    first = train[0]
    assert first["reward_model"]["ground_truth"] == "72"
    assert first["prompt"][0]["content"].startswith("Natalia sold clips")
    assert first["extra_info"]["index"] == 0 and first["extra_info"]["split"] == "train"
    assert first["extra_info"]["answer"].endswith("#### 72")
    # somewhere a reference answer has a thousands comma, removed in the ground truth
    with_comma = [r for r in train if "," in r["extra_info"]["answer"].split("####")[-1]]
    assert with_comma and all("," not in r["reward_model"]["ground_truth"] for r in with_comma)
    assert all(r["reward_model"]["ground_truth"].lstrip("-").replace(".", "").isdigit() for r in train)
    # the converted rows load as a dataset under the default prompt length
    from types import SimpleNamespace

    from rlforge.data import load_rl_dataset

    cfg = SimpleNamespace(
        prompt_key="prompt",
        max_prompt_length=512,
        truncation="error",
        filter_overlong_prompts=False,
        seed=1,
        builtin=None,
    )
    ds = load_rl_dataset(str(tmp_path / "test.parquet"), smol_tokenizer, cfg, split="val")
    assert len(ds) == 1319 and ds[0]["data_source"] == "openai/gsm8k"

"""GSM8K conversion to verl's parquet format (on the official files when present)."""

from __future__ import annotations

import json
import os

import pyarrow.parquet as pq
import pytest

from rlforge.data import convert_gsm8k
from rlforge.data.gsm8k import INSTRUCTION, extract_reference_answer
from rlforge.errors import DataError

SRC = "/work/shared/data/gsm8k"


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


@pytest.mark.skipif(
    not (os.path.isfile(f"{SRC}/train.jsonl") and os.path.isfile(f"{SRC}/test.jsonl")),
    reason=f"official GSM8K files not found in {SRC}",
)
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

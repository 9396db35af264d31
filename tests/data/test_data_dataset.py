"""Reading parquet/jsonl rows and building RLDataset: errors, truncation, filtering."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from rlforge.data import RLDataset, load_rl_dataset, read_file, tokenize_messages, truncate
from rlforge.errors import ConfigError, DataError


def row(question: str, truth: str = "1", **extra) -> dict:
    return {
        "data_source": "rlforge/arithmetic",
        "prompt": [{"role": "user", "content": question}],
        "ability": "arithmetic",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": dict(extra),
    }


def data_cfg(**overrides) -> SimpleNamespace:
    cfg = dict(
        prompt_key="prompt",
        max_prompt_length=64,
        truncation="error",
        filter_overlong_prompts=False,
        seed=1,
        builtin=SimpleNamespace(difficulty=1, train_size=32, val_size=8),
    )
    cfg.update(overrides)
    return SimpleNamespace(**cfg)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_parquet(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return str(path)


def test_tokenize_messages_returns_ids(smol_tokenizer) -> None:
    ids = tokenize_messages(smol_tokenizer, [{"role": "user", "content": "What is 7 + 5?"}])
    assert all(isinstance(t, int) for t in ids)
    text = smol_tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n") and "What is 7 + 5?" in text


def test_read_jsonl_and_parquet(smol_tokenizer, tmp_path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [row("What is 1 + 1?", "2"), row("What is 2 + 2?", 4, index=7)])
    b = write_parquet(
        tmp_path / "b.parquet",
        [row("What is 3 + 3?", "6", split="x", index=None), row("4?", "4", split="y", index=5)],
    )
    assert len(read_file(a)) == 2 and read_file(b)[0]["reward_model"]["ground_truth"] == "6"
    ds = load_rl_dataset([a, b], smol_tokenizer, data_cfg(), split="train")
    assert len(ds) == 4
    item = ds[1]
    assert item["input_ids"].dtype == torch.long and item["input_ids"].dim() == 1
    assert item["ground_truth"] == "4"  # numbers become strings
    assert item["extra_info"]["index"] == 7  # kept from the file
    assert ds[0]["extra_info"]["index"] == 0  # added: position in the dataset
    assert ds[2]["extra_info"] == {"split": "x", "index": 2}  # a null index is filled in
    assert ds[3]["extra_info"] == {"split": "y", "index": 5}
    assert ds[2]["raw_prompt"] == [{"role": "user", "content": "What is 3 + 3?"}]
    assert ds[2]["data_source"] == "rlforge/arithmetic" and ds[2]["ability"] == "arithmetic"
    expected = tokenize_messages(smol_tokenizer, ds[2]["raw_prompt"])
    assert ds[2]["input_ids"].tolist() == expected


def test_single_path_string_and_tilde(smol_tokenizer, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    write_jsonl(tmp_path / "t.jsonl", [row("Hi?")])
    assert len(load_rl_dataset("~/t.jsonl", smol_tokenizer, data_cfg())) == 1


def test_missing_file(smol_tokenizer, tmp_path) -> None:
    with pytest.raises(DataError, match="not found: .*missing.parquet"):
        load_rl_dataset(str(tmp_path / "missing.parquet"), smol_tokenizer, data_cfg())


def test_missing_file_names_the_key_and_folder(smol_tokenizer, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        load_rl_dataset("data/gsm8k/test.parquet", smol_tokenizer, data_cfg(), split="val")
    msg = str(err.value)
    assert msg.startswith("data.val_files: data file not found: data/gsm8k/test.parquet"), msg
    assert f"relative to the current folder {tmp_path}" in msg
    assert "rlforge data gsm8k" in msg
    with pytest.raises(DataError, match=r"^data.train_files: data file not found: .*m.jsonl$"):
        load_rl_dataset(str(tmp_path / "m.jsonl"), smol_tokenizer, data_cfg())


def test_bad_json_line_and_suffix(tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(row("ok")) + "\n{not json\n")
    with pytest.raises(DataError, match="bad.jsonl line 2"):
        read_file(str(bad))
    other = tmp_path / "data.csv"
    other.write_text("a,b\n")
    with pytest.raises(DataError, match="unsupported data file .*data.csv"):
        read_file(str(other))


def test_row_without_prompt(smol_tokenizer, tmp_path) -> None:
    broken = row("x")
    del broken["prompt"]
    path = write_jsonl(tmp_path / "p.jsonl", [row("fine"), broken])
    with pytest.raises(DataError, match=r"p.jsonl row 1 has no 'prompt' field"):
        load_rl_dataset(path, smol_tokenizer, data_cfg())


def test_raw_gsm8k_jsonl_names_fields_and_the_converter(smol_tokenizer, tmp_path) -> None:
    # a user who passes GSM8K's own train.jsonl (question/answer rows) instead of the converted parquet
    path = write_jsonl(tmp_path / "train.jsonl", [{"question": "1+1?", "answer": "2\n#### 2"}])
    with pytest.raises(DataError) as err:
        load_rl_dataset(path, smol_tokenizer, data_cfg())
    msg = str(err.value)
    assert "train.jsonl row 0 has no 'prompt' field" in msg
    assert "its fields: question, answer" in msg
    assert "rlforge data gsm8k --src DIR" in msg


def test_prompt_key(smol_tokenizer, tmp_path) -> None:
    r = row("Q?")
    r["messages"] = r.pop("prompt")
    path = write_jsonl(tmp_path / "k.jsonl", [r])
    assert len(load_rl_dataset(path, smol_tokenizer, data_cfg(prompt_key="messages"))) == 1
    with pytest.raises(DataError, match="data.prompt_key='prompt'"):
        load_rl_dataset(path, smol_tokenizer, data_cfg())


def test_prompt_not_messages(smol_tokenizer) -> None:
    bad = row("x")
    bad["prompt"] = "What is 1 + 1?"
    with pytest.raises(DataError, match="mine row 0: 'prompt' must be a non-empty list of chat messages"):
        RLDataset([bad], smol_tokenizer, 64, source_name="mine")


def test_row_without_ground_truth(smol_tokenizer, tmp_path) -> None:
    broken = row("x")
    broken["reward_model"] = {"style": "rule"}
    rows = [row("a", index=0), row("b", index=1), broken]
    broken["extra_info"] = {"index": 2}
    path = write_parquet(tmp_path / "g.parquet", rows)
    with pytest.raises(DataError, match=r"g.parquet row 2 has no reward_model.ground_truth"):
        load_rl_dataset(path, smol_tokenizer, data_cfg())


def long_rows() -> list[dict]:
    return [row("short?"), row(" ".join(["word"] * 60) + "?"), row("also short?")]


def test_truncation_error(smol_tokenizer) -> None:
    with pytest.raises(DataError) as err:
        RLDataset(long_rows(), smol_tokenizer, 40, truncation="error", source_name="f.parquet")
    msg = str(err.value)
    n = len(tokenize_messages(smol_tokenizer, long_rows()[1]["prompt"]))
    assert f"f.parquet row 1: prompt is {n} tokens" in msg and "data.max_prompt_length=40" in msg
    assert "data.filter_overlong_prompts=True" in msg and "data.truncation=left" in msg


def test_truncation_left_right_middle(smol_tokenizer) -> None:
    full = tokenize_messages(smol_tokenizer, long_rows()[1]["prompt"])
    left = RLDataset(long_rows(), smol_tokenizer, 40, truncation="left")
    right = RLDataset(long_rows(), smol_tokenizer, 40, truncation="right")
    middle = RLDataset(long_rows(), smol_tokenizer, 40, truncation="middle")
    assert len(left) == 3 and left.num_truncated == 1
    assert left[1]["input_ids"].tolist() == full[-40:]
    assert right[1]["input_ids"].tolist() == full[:40]
    assert middle[1]["input_ids"].tolist() == full[:20] + full[-20:]
    assert left[0]["input_ids"].tolist() == tokenize_messages(smol_tokenizer, long_rows()[0]["prompt"])
    assert truncate([1, 2, 3, 4, 5], 3, "middle") == [1, 4, 5]


def test_filter_overlong(smol_tokenizer, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="rlforge.data.dataset"):
        ds = RLDataset(long_rows(), smol_tokenizer, 40, truncation="error", filter_overlong_prompts=True)
    assert len(ds) == 2 and ds.num_filtered == 1
    assert [it["extra_info"]["index"] for it in ds] == [0, 2]
    assert "dropped 1 of 3 prompts" in caplog.text


def test_bad_truncation_value(smol_tokenizer) -> None:
    with pytest.raises(ConfigError, match="data.truncation='sideways'"):
        RLDataset(long_rows(), smol_tokenizer, 40, truncation="sideways")


def test_float32_ground_truth_reads_as_written(smol_tokenizer, tmp_path) -> None:
    """A float32 column holds 0.1 as 0.100000001490116...; the reward must see "0.1" (it used to see
    '0.10000000149011612', so '#### 0.1' scored 0 with no warning).  Nested (reward_model) and top level."""
    from rlforge.rewards import default_compute_score

    truths = [0.1, 2.675, 1e-8, 123456.7]
    schema = pa.schema([
        ("data_source", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.float32())])),
        ("score32", pa.float32()),
        ("vals", pa.list_(pa.float32())),
    ])
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "q?"}],
             "reward_model": {"style": "rule", "ground_truth": t}, "score32": t, "vals": [t, None]} for t in truths]
    path = str(tmp_path / "f32.parquet")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    read = read_file(path)
    assert [r["reward_model"]["ground_truth"] for r in read] == truths
    assert [r["score32"] for r in read] == truths and [r["vals"] for r in read] == [[t, None] for t in truths]
    ds = load_rl_dataset(path, smol_tokenizer, data_cfg())
    assert [it["ground_truth"] for it in ds] == ["0.1", "2.675", "1e-08", "123456.7"]
    assert default_compute_score("openai/gsm8k", "#### 0.1", ds[0]["ground_truth"], None) == 1.0
    assert default_compute_score("openai/gsm8k", "#### 2.675", ds[1]["ground_truth"], None) == 1.0


def test_empty_file_is_named(smol_tokenizer, tmp_path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    full = write_jsonl(tmp_path / "full.jsonl", [row("Hi?")])
    with pytest.raises(DataError) as err:
        load_rl_dataset(str(empty), smol_tokenizer, data_cfg(), split="val")
    msg = str(err.value)
    assert msg.startswith(f"data.val_files: no prompts: {empty} (0 rows); rows read 0, kept 0"), msg
    assert "batch_size" not in msg
    assert len(load_rl_dataset([str(empty), full], smol_tokenizer, data_cfg())) == 1  # one empty file is fine


def test_all_rows_filtered_names_the_filter(smol_tokenizer, tmp_path) -> None:
    path = write_jsonl(tmp_path / "long.jsonl", [row(" ".join(["word"] * 60) + "?")] * 3)
    with pytest.raises(DataError) as err:
        load_rl_dataset(path, smol_tokenizer, data_cfg(max_prompt_length=40, filter_overlong_prompts=True))
    msg = str(err.value)
    assert msg.startswith(f"data.train_files: no prompts left: {path} (3 rows); rows read 3, kept 0: all 3 were "
                          "longer than data.max_prompt_length=40 tokens and data.filter_overlong_prompts=True"), msg
    assert "batch_size" not in msg


_THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
)
"""Qwen3's switch, reduced: ``enable_thinking=False`` closes an empty think block in the generation prompt."""


def test_apply_chat_template_kwargs_reach_the_template(smol_tokenizer, tmp_path) -> None:
    """``data.apply_chat_template_kwargs`` are passed to the chat template (Qwen3's ``enable_thinking``)."""
    import copy

    tok = copy.deepcopy(smol_tokenizer)
    tok.chat_template = _THINKING_TEMPLATE
    path = write_jsonl(tmp_path / "a.jsonl", [row("What is 1 + 1?", "2")])
    plain = load_rl_dataset(path, tok, data_cfg(apply_chat_template_kwargs={}))[0]["input_ids"].tolist()
    off = load_rl_dataset(path, tok, data_cfg(apply_chat_template_kwargs={"enable_thinking": False}))
    on = load_rl_dataset(path, tok, data_cfg(apply_chat_template_kwargs={"enable_thinking": True}))
    want = "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"
    assert tok.decode(plain) == want
    assert tok.decode(off[0]["input_ids"].tolist()) == want + "<think>\n\n</think>\n\n"
    assert on[0]["input_ids"].tolist() == plain
    assert tokenize_messages(tok, [{"role": "user", "content": "What is 1 + 1?"}],
                             template_kwargs={"enable_thinking": False}) == off[0]["input_ids"].tolist()

"""Prompt data: verl-format parquet/jsonl rows, built-in tasks, tokenized datasets, loaders.

Public API:
    load_rl_dataset(files, tokenizer, data_cfg, split) -> RLDataset
    RLDataset(rows, tokenizer, max_prompt_length, truncation, filter_overlong_prompts, prompt_key, ...)
    PromptLoader(dataset, batch_size, shuffle, seed, drop_last) -> iterates Batch
    collate_prompts(items, pad_token_id) -> Batch
    convert_gsm8k(src_dir | None, out_dir) -> {split: rows}  (None: from the Hub through `datasets`)
    BUILTIN_TASKS: Registry of built-in generated tasks (``builtin:arithmetic``)
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_HOMES = {  # name -> the module that defines it; imported on first use, so that `rlforge data gsm8k` needs no torch
    "RLDataset": "dataset", "tokenize_messages": "dataset", "truncate": "dataset", "convert_gsm8k": "gsm8k",
    "load_rl_dataset": "load", "load_rows": "load", "PromptLoader": "loader", "collate_prompts": "loader",
    "read_file": "readers", "read_rows": "readers", "BUILTIN_TASKS": "tasks",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'rlforge.data' has no attribute {name!r}")
    return getattr(import_module(f"rlforge.data.{_HOMES[name]}"), name)


__all__ = [
    "BUILTIN_TASKS",
    "PromptLoader",
    "RLDataset",
    "collate_prompts",
    "convert_gsm8k",
    "load_rl_dataset",
    "load_rows",
    "read_file",
    "read_rows",
    "tokenize_messages",
    "truncate",
]

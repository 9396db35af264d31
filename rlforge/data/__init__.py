"""Prompt data: verl-format parquet/jsonl rows, built-in tasks, tokenized datasets, loaders.

Public API:
    load_rl_dataset(files, tokenizer, data_cfg, split) -> RLDataset
    RLDataset(rows, tokenizer, max_prompt_length, truncation, filter_overlong_prompts, prompt_key, ...)
    PromptLoader(dataset, batch_size, shuffle, seed, drop_last) -> iterates Batch
    collate_prompts(items, pad_token_id) -> Batch
    convert_gsm8k(src_dir | None, out_dir) -> {split: rows}  (None: from the Hub through `datasets`)
    BUILTIN_TASKS: Registry of built-in generated tasks (``builtin:arithmetic``)
"""

from rlforge.data.dataset import RLDataset, tokenize_messages, truncate
from rlforge.data.gsm8k import convert_gsm8k
from rlforge.data.load import load_rl_dataset, load_rows
from rlforge.data.loader import PromptLoader, collate_prompts
from rlforge.data.readers import read_file, read_rows
from rlforge.data.tasks import BUILTIN_TASKS

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

"""Prompt dataset: verl-format rows → chat-templated, length-checked token ids.

Source: mirrors verl's ``RLHFDataset`` (``verl/utils/dataset/rl_dataset.py``): the prompt
messages go through ``tokenizer.apply_chat_template(..., add_generation_prompt=True)``;
over-long prompts are either filtered (``data.filter_overlong_prompts``) or handled by
``data.truncation``.  Unlike verl, every prompt is tokenized once, up front, so the
filtered count is known (and logged) before training starts.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rlforge.errors import ConfigError, DataError

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")


def tokenize_messages(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> list[int]:
    """Token ids of ``messages`` rendered with the chat template and a generation prompt.

    ``tools`` (OpenAI function schemas) are passed as the template's ``tools=`` argument when given
    (a template that ignores it renders the same ids as without).  ``template_kwargs``
    (``data.apply_chat_template_kwargs``, e.g. ``{"enable_thinking": False}`` for Qwen3) are passed to
    ``tokenizer.apply_chat_template`` as extra keywords, which the template reads as variables, as
    verl's ``RLHFDataset`` does.  transformers 5 returns a
    ``BatchEncoding`` from ``apply_chat_template(tokenize=True)``; older versions return a plain
    list.  Both are accepted.

    Returns:
        list of token ids ``(prompt_len,)``.
    """
    kw: dict[str, Any] = dict(template_kwargs or {})
    if tools:
        kw["tools"] = tools
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kw)
    if isinstance(out, Mapping) or hasattr(out, "keys"):
        out = out["input_ids"]
    if isinstance(out, torch.Tensor | np.ndarray):
        out = out.tolist()
    if out and isinstance(out[0], list):  # a batch of one
        out = out[0]
    return [int(t) for t in out]


def template_renders_tools(tokenizer: Any, tools: list[dict[str, Any]]) -> bool:
    """Whether ``tokenizer``'s chat template renders ``tools`` (OpenAI function schemas): True when a
    one-message conversation comes out differently with ``tools=`` than without.  False for no tools,
    no chat template, or a template that raises on ``tools=``."""
    if not tools or not getattr(tokenizer, "chat_template", None):
        return False
    probe = [{"role": "user", "content": "hi"}]
    try:
        with_tools = tokenizer.apply_chat_template(probe, tools=tools, add_generation_prompt=True, tokenize=False)
    except Exception:  # noqa: BLE001 - a template that cannot take tools falls back to none
        return False
    return with_tools != tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)


def truncate(ids: list[int], max_len: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``max_len`` tokens: ``left`` keeps the end, ``right`` keeps the start,
    ``middle`` keeps ``max_len // 2`` tokens at the start and the rest at the end (verl's split).
    """
    if len(ids) <= max_len:
        return ids
    if mode == "left":
        return ids[-max_len:]
    if mode == "right":
        return ids[:max_len]
    if mode == "middle":
        head = max_len // 2
        tail = max_len - head
        return ids[:head] + (ids[-tail:] if tail else [])
    raise ConfigError(f"data.truncation={mode!r} is not one of {', '.join(TRUNCATION_MODES)}")


def _ground_truth(row: dict[str, Any]) -> Any:
    rm = row.get("reward_model")
    gt = rm.get("ground_truth") if isinstance(rm, Mapping) else None
    if isinstance(gt, bool) or not isinstance(gt, int | float | np.integer | np.floating):
        return gt
    return str(gt) if not (isinstance(gt, float) and math.isnan(gt)) else None


def _check_messages(
    messages: Any, origin: str, prompt_key: str, fields: Sequence[str] = ()
) -> list[dict[str, Any]]:
    if messages is None:
        msg = f"{origin} has no {prompt_key!r} field (data.prompt_key={prompt_key!r})"
        if fields:
            msg += f"; its fields: {', '.join(map(str, fields))}"
        if {"question", "answer"} <= set(fields):  # the official GSM8K jsonl, not verl's format
            msg += "; for GSM8K's own train.jsonl/test.jsonl, convert them first with `rlforge data gsm8k --src DIR --out FOLDER`"
        raise DataError(msg)
    if isinstance(messages, np.ndarray):
        messages = messages.tolist()
    ok = (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, Mapping) and "role" in m and "content" in m for m in messages)
    )
    if not ok:
        raise DataError(
            f"{origin}: {prompt_key!r} must be a non-empty list of chat messages "
            f"{{'role': ..., 'content': ...}}, got {str(messages)[:80]!r}"
        )
    for j, m in enumerate(messages):
        if not isinstance(m["content"], str):
            raise DataError(f"{origin}: {prompt_key}[{j}].content must be a string, got {type(m['content']).__name__}")
        if m["role"] not in _ROLES:
            raise DataError(f"{origin}: {prompt_key}[{j}].role={m['role']!r} is not one of {', '.join(_ROLES)}")
    return [dict(m) for m in messages]


_ROLES = ("system", "user", "assistant", "tool")


class RLDataset:
    """Tokenized prompts with their reward metadata.

    Args:
        rows: verl-format rows (see :mod:`rlforge.data.readers`).
        tokenizer: a Hugging Face tokenizer with a chat template.
        max_prompt_length: ``data.max_prompt_length``, in tokens (> 0).
        truncation: ``data.truncation``: ``error`` | ``left`` | ``right`` | ``middle``.
        filter_overlong_prompts: ``data.filter_overlong_prompts``: drop prompts longer than
            ``max_prompt_length`` (a warning gives the count) instead of truncating.
        prompt_key: ``data.prompt_key``, the column holding the chat messages.
        source_name: names the rows in errors when ``origins`` is not given.
        origins: per-row descriptions such as ``"train.parquet row 3"``, for error messages.
        tools: OpenAI function schemas of the multi-turn tools (``rollout.multi_turn.tool_config_path``),
            rendered into every prompt by the chat template's ``tools=`` argument, as verl's agent loop
            does, when the template renders them (:func:`template_renders_tools`); otherwise a warning
            and the prompts are rendered without them (the prompt itself must then describe the tools).
            :attr:`tools_rendered` says which.
        chat_template_kwargs: ``data.apply_chat_template_kwargs``: extra keywords for every
            ``tokenizer.apply_chat_template`` call (see :func:`tokenize_messages`); None = none.

    Each item is a dict with ``input_ids`` (1-D LongTensor ``(prompt_len,)``), ``raw_prompt``
    (the messages), ``data_source`` (str), ``ground_truth`` (str; numbers are converted,
    other types such as lists are passed through for custom reward functions),
    ``extra_info`` (dict, always with ``index``; defaults to the row's position) and ``ability``.

    Raises:
        DataError: a row lacks the prompt or ``reward_model.ground_truth``, or a prompt is
            longer than ``max_prompt_length`` with ``truncation='error'`` (names the row).
        ConfigError: bad ``truncation`` or ``max_prompt_length``.
    """

    def __init__(
        self,
        rows: Sequence[dict[str, Any]],
        tokenizer: Any,
        max_prompt_length: int,
        truncation: str = "error",
        filter_overlong_prompts: bool = False,
        prompt_key: str = "prompt",
        source_name: str = "dataset",
        origins: Sequence[str] | None = None,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if truncation not in TRUNCATION_MODES:
            raise ConfigError(f"data.truncation={truncation!r} is not one of {', '.join(TRUNCATION_MODES)}")
        if not isinstance(max_prompt_length, int) or max_prompt_length <= 0:
            raise ConfigError(f"data.max_prompt_length must be a positive integer, got {max_prompt_length!r}")
        if origins is not None and len(origins) != len(rows):
            raise ValueError(f"{len(origins)} origins for {len(rows)} rows")
        self.tokenizer = tokenizer
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_prompt_length = max_prompt_length
        self.source_name = source_name
        pad = getattr(tokenizer, "pad_token_id", None)
        self.pad_token_id: int = int(
            pad if pad is not None else (getattr(tokenizer, "eos_token_id", None) or 0)
        )
        self.tools_rendered = bool(tools) and template_renders_tools(tokenizer, list(tools or []))
        self.tools = list(tools or []) if self.tools_rendered else None
        if tools and not self.tools_rendered:
            logger.warning(
                "%s: the tokenizer's chat template does not render tool schemas (its tools= argument changes "
                "nothing); the prompts go without them, so describe the tools in the prompt (as "
                "builtin:tool_arithmetic does)",
                source_name,
            )
        self.items: list[dict[str, Any]] = []
        self.num_filtered = 0
        self.num_truncated = 0
        for i, row in enumerate(rows):
            origin = origins[i] if origins is not None else f"{source_name} row {i}"
            item = self._make_item(row, i, origin, prompt_key, truncation, filter_overlong_prompts)
            if item is not None:
                self.items.append(item)
        if self.num_filtered:
            logger.warning(
                "%s: dropped %d of %d prompts longer than data.max_prompt_length=%d "
                "(data.filter_overlong_prompts=True)",
                source_name,
                self.num_filtered,
                len(rows),
                max_prompt_length,
            )
        if self.num_truncated:
            logger.warning(
                "%s: truncated %d of %d prompts to data.max_prompt_length=%d (data.truncation=%s)",
                source_name,
                self.num_truncated,
                len(rows),
                max_prompt_length,
                truncation,
            )

    def _make_item(
        self,
        row: dict[str, Any],
        i: int,
        origin: str,
        prompt_key: str,
        truncation: str,
        filter_overlong: bool,
    ) -> dict[str, Any] | None:
        if not isinstance(row, Mapping):
            raise DataError(f"{origin} is a {type(row).__name__}, expected a dict")
        messages = _check_messages(row.get(prompt_key), origin, prompt_key, list(row))
        gt = _ground_truth(row)
        if gt is None:
            raise DataError(f"{origin} has no reward_model.ground_truth")
        ids = tokenize_messages(self.tokenizer, messages, self.tools, self.chat_template_kwargs)
        if len(ids) > self.max_prompt_length:
            if filter_overlong:
                self.num_filtered += 1
                return None
            if truncation == "error":
                raise DataError(
                    f"{origin}: prompt is {len(ids)} tokens, longer than data.max_prompt_length="
                    f"{self.max_prompt_length}; raise data.max_prompt_length, set "
                    f"data.filter_overlong_prompts=True to drop such prompts, or data.truncation=left"
                )
            ids = truncate(ids, self.max_prompt_length, truncation)
            self.num_truncated += 1
        extra = row.get("extra_info")
        if extra is not None and not isinstance(extra, Mapping):
            raise DataError(f"{origin}: 'extra_info' must be a dict (or absent), got {type(extra).__name__}")
        if not isinstance(row.get("data_source"), str) or not row.get("data_source"):
            raise DataError(f"{origin}: 'data_source' (a non-empty string naming the reward rule) is missing")
        extra = dict(extra) if isinstance(extra, Mapping) else {}
        if extra.get("index") is None:  # parquet structs turn absent keys into None
            extra["index"] = i
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "raw_prompt": messages,
            "data_source": str(row.get("data_source", "")),
            "ground_truth": gt,
            "extra_info": extra,
            "ability": str(row.get("ability", "")),
        }

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.items[index]

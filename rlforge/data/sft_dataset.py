"""SFT samples: chats rendered by the tokenizer's chat template, with a loss mask on the assistant turns.

A row is a multi-turn chat when it has ``data.messages_key`` (a list of ``{role, content}``); otherwise
``data.prompt_key`` / ``data.response_key`` make a one-turn chat (a user turn, an assistant turn).
``builtin:arithmetic`` gives the built-in task's questions with their exact answers as the assistant turn.

Loss mask (verl's ``MultiTurnSFTDataset``): 1 on the tokens that the chat template renders for each
assistant message after its generation prompt (the assistant's content and the template's end-of-turn
text, e.g. ``<|im_end|>\\n``), 0 on system/user turns and on each assistant turn's header
(``<|im_start|>assistant\\n``).  It is computed by prefixes: for assistant message ``i`` the chat
``messages[:i]`` rendered with the generation prompt and ``messages[:i + 1]`` rendered without one
bound its tokens.  A template whose renders are not prefixes of the whole chat's (one that rewrites
earlier turns) is refused, naming the row.

Per-row template inputs (verl's ``MultiTurnSFTDataset``): a row's ``data.tools_key`` column (a list of tool
schemas, or its JSON text) is passed as ``tools=`` to every render of that row's chat, and its
``data.enable_thinking_key`` column (true/false) sets ``enable_thinking`` for that row over
``data.apply_chat_template_kwargs``.  A missing column, or a null value, leaves the config's settings.
The loss mask stays on the assistant turns: the tool list is rendered in the system/first turn, outside them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from rlforge.batch import Batch
from rlforge.data.load import load_rows
from rlforge.data.readers import as_file_list
from rlforge.errors import DataError


@dataclass(frozen=True)
class SFTSample:
    """One tokenized chat: ``input_ids`` and ``loss_mask`` (1 = a token the loss trains on), same length."""

    input_ids: list[int]
    loss_mask: list[int]


@dataclass(frozen=True)
class SFTChat:
    """One row's chat and its per-row template inputs (see the module docstring)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    """The row's tool schemas, passed as ``tools=`` to the chat template; None = none."""
    enable_thinking: bool | None = None
    """The row's ``enable_thinking``; None = ``data.apply_chat_template_kwargs``'s (or the template's default)."""


def _render(tokenizer: Any, messages: list[dict[str, Any]], generation_prompt: bool,
            template_kwargs: Mapping[str, Any], tools: list[dict[str, Any]] | None) -> list[int]:
    out = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                        tokenize=True, **dict(template_kwargs))
    if isinstance(out, Mapping) or hasattr(out, "keys"):
        out = out["input_ids"]
    if isinstance(out, torch.Tensor | np.ndarray):
        out = out.tolist()
    if out and isinstance(out[0], list):
        out = out[0]
    return [int(t) for t in out]


def tokenize_chat(tokenizer: Any, messages: list[dict[str, Any]], origin: str,
                  template_kwargs: Mapping[str, Any] | None = None,
                  tools: list[dict[str, Any]] | None = None) -> SFTSample:
    """``messages`` rendered by ``tokenizer``'s chat template with the loss mask of the module docstring;
    ``template_kwargs`` and ``tools`` go to every render.

    Raises:
        DataError: no chat template, or a template that rewrites earlier turns (naming ``origin``).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise DataError(f"{origin}: the tokenizer has no chat template; set model.tokenizer_path to one that has")
    kw = dict(template_kwargs or {})
    ids = _render(tokenizer, messages, False, kw, tools)
    mask = [0] * len(ids)
    for i, msg in enumerate(messages):
        if msg.get("role") != "assistant":
            continue
        start = _render(tokenizer, messages[:i], True, kw, tools) if i else []
        end = _render(tokenizer, messages[: i + 1], False, kw, tools)
        if ids[: len(end)] != end or end[: len(start)] != start:
            raise DataError(f"{origin}: the chat template renders message {i} differently inside the whole chat "
                            "(it rewrites earlier turns), so the assistant tokens cannot be located")
        mask[len(start): len(end)] = [1] * (len(end) - len(start))
    return SFTSample(ids, mask)


ROLES = ("system", "user", "assistant", "tool")
"""The chat roles a row may use (the RL data's, :mod:`rlforge.data.dataset`)."""


def _check_messages(value: Any, origin: str, key: str) -> list[dict[str, Any]]:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, list) or not value or not all(isinstance(m, Mapping) and "role" in m for m in value):
        raise DataError(f"{origin}: {key} must be a non-empty list of {{role, content}} messages")
    msgs = [dict(m) for m in value]
    for i, m in enumerate(msgs):
        if m["role"] not in ROLES:
            raise DataError(f"{origin}: {key} message {i} has role {m['role']!r}, not one of {', '.join(ROLES)}")
        _check_content(m, f"{origin}: {key} message {i} ({m['role']!r})")
    if not any(m["role"] == "assistant" for m in msgs):
        raise DataError(f"{origin}: {key} has no assistant message, so nothing would be trained on")
    return msgs


def _check_content(message: Mapping[str, Any], where: str) -> None:
    """Refuse a message whose ``content`` is missing, null or not text (verl's ``MultiTurnSFTDataset`` takes
    text only); an assistant message with ``tool_calls`` may leave it out."""
    content = message.get("content")
    if isinstance(content, str):
        return
    if content is None and message.get("tool_calls"):
        return
    got = "has no 'content'" if "content" not in message else (
        "has a null 'content'" if content is None else f"has a 'content' of type {type(content).__name__} ({content!r:.40})")
    raise DataError(f"{where} {got}; each message needs its text as a string in 'content'")


def row_messages(row: Mapping[str, Any], data_cfg: Any, origin: str) -> list[dict[str, Any]]:
    """The chat of one row: ``messages_key``, else ``prompt_key`` + ``response_key`` (see the module doc).

    Raises:
        DataError: the row has neither form, a message without text ``content``, or a null prompt /
            response (naming ``origin`` and the key).
    """
    if data_cfg.messages_key in row:
        return _check_messages(row[data_cfg.messages_key], origin, f"data.messages_key={data_cfg.messages_key!r}")
    p, r = data_cfg.prompt_key, data_cfg.response_key
    if p in row and r in row:
        for value, k, name in ((row[p], p, "data.prompt_key"), (row[r], r, "data.response_key")):
            if _is_null(value):
                raise DataError(f"{origin}: column {k!r} ({name}) is null; give it text or drop the row")
        return [{"role": "user", "content": str(row[p])}, {"role": "assistant", "content": str(row[r])}]
    raise DataError(f"{origin}: no column {data_cfg.messages_key!r} (data.messages_key) nor both {p!r} and {r!r} "
                    f"(data.prompt_key, data.response_key); its columns are {sorted(row)}")


def _builtin_chat(row: Mapping[str, Any]) -> dict[str, Any]:
    """A built-in task's row as a chat: its prompt, then its ground truth as the assistant's answer."""
    answer = str(row["reward_model"]["ground_truth"])
    return {"messages": [*[dict(m) for m in row["prompt"]], {"role": "assistant", "content": answer}]}


def _plain(value: Any) -> Any:
    """``value`` with NumPy arrays (nested ones too) turned into lists."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _is_null(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def row_tools(row: Mapping[str, Any], key: str, origin: str) -> list[dict[str, Any]] | None:
    """The row's tool schemas (column ``key``, ``data.tools_key``): a list of objects, or its JSON text;
    None when the column is missing, null or an empty list.

    Raises:
        DataError: text that is not valid JSON, or a value that is not a list of objects (naming ``origin``).
    """
    value = _plain(row.get(key))
    if _is_null(value):
        return None
    where = f"{origin}: column {key!r} (data.tools_key)"
    if isinstance(value, str):
        if not value.strip():
            return None
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise DataError(f"{where} is not valid JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(value, list) or not all(isinstance(t, Mapping) for t in value):
        got = type(value).__name__ if not isinstance(value, list) else "a list with a non-object item"
        raise DataError(f"{where} must be a list of tool schemas (objects) or its JSON text, got {got}")
    return [dict(t) for t in value] or None


def row_enable_thinking(row: Mapping[str, Any], key: str, origin: str) -> bool | None:
    """The row's ``enable_thinking`` (column ``key``, ``data.enable_thinking_key``); None when the
    column is missing or null.

    Raises:
        DataError: a value other than true/false (naming ``origin``).
    """
    value = row.get(key)
    if _is_null(value):
        return None
    if isinstance(value, bool | np.bool_):
        return bool(value)
    raise DataError(f"{origin}: column {key!r} (data.enable_thinking_key) must be true, false or null, "
                    f"got {value!r} ({type(value).__name__})")


def row_chat(row: Mapping[str, Any], data_cfg: Any, origin: str) -> SFTChat:
    """One row as an :class:`SFTChat`: :func:`row_messages`, :func:`row_tools`, :func:`row_enable_thinking`."""
    return SFTChat(row_messages(row, data_cfg, origin), row_tools(row, data_cfg.tools_key, origin),
                   row_enable_thinking(row, data_cfg.enable_thinking_key, origin))


def load_chats(files: Any, data_cfg: Any, split: str, seed: int, max_samples: int = -1
               ) -> tuple[list[SFTChat], list[str]]:
    """The chats of ``files`` (``data.train_files`` / ``val_files``) and each one's origin, in order;
    ``max_samples`` >= 0 keeps the first ones.

    Raises:
        DataError: a missing file, a row of neither form, or a bad tools / enable_thinking value.
    """
    key = "data.train_files" if split == "train" else "data.val_files"
    rl_data = SimpleNamespace(builtin=data_cfg.builtin, seed=seed)
    chats, origins = [], []
    for entry in as_file_list(files, key):
        rows, where = load_rows([entry], rl_data, split)
        if entry.startswith("builtin:"):
            rows = [_builtin_chat(r) for r in rows]
            view = SimpleNamespace(messages_key="messages", prompt_key="", response_key="", tools_key="",
                                   enable_thinking_key="")
        else:
            view = data_cfg
        chats += [row_chat(r, view, o) for r, o in zip(rows, where, strict=True)]
        origins += where
    if max_samples is not None and max_samples >= 0:
        chats, origins = chats[:max_samples], origins[:max_samples]
    return chats, origins


def truncate_sample(sample: SFTSample, max_length: int, mode: str, origin: str) -> SFTSample:
    """``sample`` cut to ``max_length`` tokens (``data.truncation``: ``left`` keeps the end, ``right`` the start).

    Raises:
        DataError: ``mode == "error"`` and the sample is longer, or the cut leaves no assistant (loss)
            token, which verl would train on silently (naming ``origin`` and the lengths).
    """
    n = len(sample.input_ids)
    if n <= max_length:
        return sample
    if mode == "error":
        raise DataError(f"{origin}: {n} tokens, longer than data.max_length={max_length}; raise data.max_length or "
                        "set data.truncation=left/right")
    cut = slice(n - max_length, n) if mode == "left" else slice(0, max_length)
    out = SFTSample(sample.input_ids[cut], sample.loss_mask[cut])
    if not any(out.loss_mask):
        raise DataError(f"{origin}: {n} tokens cut to data.max_length={max_length} (data.truncation={mode}) leave none "
                        f"of its {sum(sample.loss_mask)} assistant tokens to train on; raise data.max_length, or set "
                        "data.truncation=error to find such rows")
    return out


def chat_template_kwargs(chat: SFTChat, data_cfg: Any) -> dict[str, Any]:
    """``data.apply_chat_template_kwargs`` with the row's ``enable_thinking`` over it (when the row sets one)."""
    kw = dict(data_cfg.apply_chat_template_kwargs or {})
    if chat.enable_thinking is not None:
        kw["enable_thinking"] = chat.enable_thinking
    return kw


def tokenize_all(tokenizer: Any, chats: Sequence[SFTChat], origins: Sequence[str], data_cfg: Any) -> list[SFTSample]:
    """Every chat tokenized (:func:`tokenize_chat`, with its row's tools and template keywords) and
    truncated (:func:`truncate_sample`)."""
    return [truncate_sample(tokenize_chat(tokenizer, c.messages, o, chat_template_kwargs(c, data_cfg), c.tools),
                            int(data_cfg.max_length), data_cfg.truncation, o)
            for c, o in zip(chats, origins, strict=True)]


def collate(samples: Sequence[SFTSample], pad_token_id: int) -> Batch:
    """Right-padded batch in the roles' layout: the first token is the "prompt" and the rest the
    "response", so the response log-probs are the next-token log-probs of the whole sample.

    Returns:
        ``input_ids``, ``attention_mask``, ``position_ids``: ``(B, L)``; ``responses``: ``(B, L - 1)``
        (``input_ids[:, 1:]``); ``response_mask``: ``(B, L - 1)`` float, the loss mask of those tokens
        (0 on padding).  ``L`` = the longest sample.
    """
    width = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), width), int(pad_token_id), dtype=torch.long)
    attn = torch.zeros((len(samples), width), dtype=torch.long)
    loss = torch.zeros((len(samples), width), dtype=torch.float32)
    for i, s in enumerate(samples):
        n = len(s.input_ids)
        ids[i, :n] = torch.tensor(s.input_ids, dtype=torch.long)
        attn[i, :n] = 1
        loss[i, :n] = torch.tensor(s.loss_mask, dtype=torch.float32)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return Batch.from_dict({"input_ids": ids, "attention_mask": attn, "position_ids": pos,
                            "responses": ids[:, 1:].clone(), "response_mask": loss[:, 1:] * attn[:, 1:]})

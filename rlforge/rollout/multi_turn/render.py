"""Token ids of inserted turns (tool responses, user replies), rendered by the model's chat template.

The model's turn ends with its EOS token (``<|im_end|>`` for ChatML templates).  What the template
puts after that token and before the next assistant turn is the *inserted* text: for ChatML
``\\n<|im_start|>tool\\n...<|im_end|>\\n<|im_start|>assistant\\n`` (Qwen2.5 wraps tool messages in
``<|im_start|>user\\n<tool_response>...``).  :meth:`TurnRenderer.insert_ids` renders a fixed
conversation, then the same conversation with the new messages and the generation prompt, and
returns the ids after the last EOS of the first rendering; the separator right after EOS (the
``\\n``) is therefore inserted too, and never dropped.  Nothing the model sampled is re-tokenized.

Tool output and user replies are text, never control tokens: the template is rendered with a
placeholder for each inserted message's content, the template's own special tokens (``<|im_start|>``,
``<|im_end|>``, ...) are encoded as such, and every stretch of text between two of them (the
message's content included, put verbatim where the template puts the placeholder) is encoded with
``split_special_tokens=True``, so a tool that prints ``<|im_end|>`` gets the ordinary tokens of that
string.  For content without special-token strings the ids equal those of encoding the whole
rendering at once (checked when the renderer is built).  Lone surrogates in content become U+FFFD.
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from rlforge.errors import ConfigError
from rlforge.rollout.multi_turn.parser import clean_text

_BASE = [{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer"}]
_PROBE = [{"role": "tool", "content": "probe 12 + 30 = 42\nok"}]


def _special_tokens(tokenizer: Any) -> dict[str, int]:
    """``{text: id}`` of the tokenizer's special tokens (those ``split_special_tokens`` stops matching)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    out = {str(t): int(i) for i, t in added.items() if getattr(t, "special", False)}
    for t in getattr(tokenizer, "all_special_tokens", []) or []:
        out.setdefault(str(t), int(tokenizer.convert_tokens_to_ids(t)))
    return {t: i for t, i in out.items() if t}


class TurnRenderer:
    """Renders inserted turns with ``tokenizer``'s chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        eos_ids: the ids that end a model turn (the rollout's EOS ids).

    Raises:
        ConfigError: the tokenizer has no chat template, or its rendering of the fixed conversation
            has no EOS id (the turn boundary cannot be found), or adding messages changes the rendering
            of the earlier ones, or the template's text cannot be encoded apart from the content exactly.
    """

    def __init__(self, tokenizer: Any, eos_ids: list[int]) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("actor_rollout_ref.rollout.multi_turn.enable=true needs a tokenizer with a chat template")
        self.tokenizer = tokenizer
        self.eos_ids = set(int(e) for e in eos_ids)
        self._specials = _special_tokens(tokenizer)
        self._special_re = re.compile("(" + "|".join(re.escape(t) for t in sorted(self._specials, key=len, reverse=True))
                                      + ")") if self._specials else None
        self._tag = f"RLFORGE{uuid.uuid4().hex}N"
        self._base = self._whole_ids(_BASE, False)
        ends = [i for i, t in enumerate(self._base) if t in self.eos_ids]
        if not ends:
            raise ConfigError("multi-turn: the chat template does not end an assistant turn with an EOS id "
                              f"({sorted(self.eos_ids)}); the turn boundary cannot be found")
        self._cut = ends[-1] + 1
        if self.insert_ids(_PROBE) != self._whole_ids(_BASE + _PROBE, True)[self._cut:]:
            raise ConfigError("multi-turn: this tokenizer encodes the chat template's text differently when the "
                              "text between its special tokens is encoded on its own (a prefix space?); tool "
                              "output cannot be kept apart from the template's control tokens")

    def _whole_ids(self, messages: list[dict[str, Any]], gen: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _text_ids(self, text: str) -> list[int]:
        if not text:
            return []
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def _ids(self, pieces: list[tuple[str, bool]]) -> list[int]:
        """Ids of the concatenated ``(text, is_template)`` pieces: special tokens only in template pieces."""
        ids: list[int] = []
        run: list[str] = []
        for text, is_template in pieces:
            parts = self._special_re.split(text) if is_template and self._special_re else [text]
            for k, part in enumerate(parts):
                if k % 2:  # a captured special token of the template
                    ids += self._text_ids("".join(run)) + [self._specials[part]]
                    run = []
                else:
                    run.append(part)
        return ids + self._text_ids("".join(run))

    def insert_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids to append after a model turn's EOS for ``messages`` (``{"role": "tool"|"user", "content": str}``),
        through the next assistant generation prompt.  Special-token strings in ``content`` are ordinary text.

        Raises:
            ConfigError: the template renders the earlier turns differently once ``messages`` follow, or
                drops or repeats a message's content.
        """
        marks = [f"{self._tag}{i}E" for i in range(len(messages))]
        shown = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
        text = self.tokenizer.apply_chat_template(_BASE + shown, tokenize=False, add_generation_prompt=True)
        pieces: list[tuple[str, bool]] = []
        for m, mark in zip(messages, marks, strict=True):
            before, sep, text = text.partition(mark)
            if not sep or mark in text:
                raise ConfigError(f"multi-turn: the chat template does not show a {m['role']!r} message's content "
                                  "exactly once; inserted tokens cannot be found")
            pieces += [(before, True), (clean_text(str(m["content"])), False)]
        full = self._ids(pieces + [(text, True)])
        if full[: self._cut] != self._base[: self._cut]:
            raise ConfigError("multi-turn: the chat template renders earlier turns differently when a "
                              f"{messages[0]['role']!r} message follows; inserted tokens cannot be found")
        return full[self._cut:]

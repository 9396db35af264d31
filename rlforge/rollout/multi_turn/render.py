"""Token ids of inserted turns (tool responses, user replies), rendered by the model's chat template.

The model's turn ends with its EOS token (``<|im_end|>`` for ChatML templates).  What the template
puts after that token and before the next assistant turn is the *inserted* text: for ChatML
``\\n<|im_start|>tool\\n...<|im_end|>\\n<|im_start|>assistant\\n`` (Qwen2.5 wraps tool messages in
``<|im_start|>user\\n<tool_response>...``).  :meth:`TurnRenderer.insert_ids` renders a fixed
conversation, then the same conversation with the new messages and the generation prompt, and
returns the ids after the last EOS of the first rendering; the separator right after EOS (the
``\\n``) is therefore inserted too, and never dropped.  Nothing the model sampled is re-tokenized.
"""

from __future__ import annotations

from typing import Any

from rlforge.errors import ConfigError

_BASE = [{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer"}]


class TurnRenderer:
    """Renders inserted turns with ``tokenizer``'s chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        eos_ids: the ids that end a model turn (the rollout's EOS ids).

    Raises:
        ConfigError: the tokenizer has no chat template, or its rendering of the fixed conversation
            has no EOS id (the turn boundary cannot be found), or adding messages changes the rendering
            of the earlier ones.
    """

    def __init__(self, tokenizer: Any, eos_ids: list[int]) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("actor_rollout_ref.rollout.multi_turn.enable=true needs a tokenizer with a chat template")
        self.tokenizer = tokenizer
        self.eos_ids = set(int(e) for e in eos_ids)
        self._base = self._ids(_BASE, False)
        ends = [i for i, t in enumerate(self._base) if t in self.eos_ids]
        if not ends:
            raise ConfigError("multi-turn: the chat template does not end an assistant turn with an EOS id "
                              f"({sorted(self.eos_ids)}); the turn boundary cannot be found")
        self._cut = ends[-1] + 1

    def _ids(self, messages: list[dict[str, Any]], gen: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def insert_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids to append after a model turn's EOS for ``messages`` (``{"role": "tool"|"user", "content"}``),
        through the next assistant generation prompt.

        Raises:
            ConfigError: the template renders the earlier turns differently once ``messages`` follow.
        """
        full = self._ids(_BASE + list(messages), True)
        if full[: self._cut] != self._base[: self._cut]:
            raise ConfigError("multi-turn: the chat template renders earlier turns differently when a "
                              f"{messages[0]['role']!r} message follows; inserted tokens cannot be found")
        return full[self._cut:]

"""A one-token-per-word fast tokenizer with a given chat template, for hand-checked SFT masks."""

from __future__ import annotations

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast


def word_tokenizer(words: list[str], template: str) -> PreTrainedTokenizerFast:
    """Token id ``i`` is ``words[i]`` (``<pad>`` for unknown words); ``template`` is its chat template."""
    t = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token="<pad>"))
    t.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=t, pad_token="<pad>")
    fast.chat_template = template
    return fast

"""Tokenizers built in code, for tasks that need an exact token layout.

``model.tokenizer_path=builtin:integers``: a word-level tokenizer in which each integer
0..100 is ONE token, plus the words of the fixed prompts and ``<pad>``/``<eos>``/``<unk>``.
With ``data.max_response_length=1`` the policy's probability of answering x is exactly
the softmax probability of token x (used by ``builtin:distribution``).
"""

from __future__ import annotations

from collections.abc import Callable

from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from rlforge.registry import Registry

BUILTIN_TOKENIZERS: Registry[Callable[[], PreTrainedTokenizerFast]] = Registry(
    "built-in tokenizer", "actor_rollout_ref.model.tokenizer_path (builtin:<name>)"
)

_SPECIALS = ["<pad>", "<eos>", "<unk>"]
_WORDS = ["Pick", "a", "number", ".", "?", ":"]


@BUILTIN_TOKENIZERS.register("integers")
def integers_tokenizer() -> PreTrainedTokenizerFast:
    """Word-level tokenizer: specials, a few prompt words, then the integers 0..100."""
    vocab = {tok: i for i, tok in enumerate(_SPECIALS + _WORDS + [str(i) for i in range(101)])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
    )
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return fast

"""The SFT loss mask, checked by hand on a multi-turn chat with a word-level tokenizer (one token per word)."""

from __future__ import annotations

import pytest
import torch
from word_tokenizer import word_tokenizer

from rlforge.config.sft import load_sft_config
from rlforge.data.sft_dataset import SFTSample, collate, row_messages, tokenize_chat, truncate_sample
from rlforge.errors import ConfigError, DataError

WORDS = ["<pad>", "system", "user", "assistant", ":", "END", "be", "brief", "hi", "hello", "there", "bye", "ok"]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} END {% endfor %}"
            "{% if add_generation_prompt %}assistant : {% endif %}")
CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello there"}, {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "ok"}]


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(WORDS, TEMPLATE)


def test_mask_is_one_on_assistant_turns_only(tok):
    s = tokenize_chat(tok, CHAT, "row 0")
    words = [WORDS[i] for i in s.input_ids]
    # 0 system 1 : 2 be 3 brief 4 END 5 user 6 : 7 hi 8 END 9 assistant 10 : 11 hello 12 there 13 END
    # 14 user 15 : 16 bye 17 END 18 assistant 19 : 20 ok 21 END
    assert words[9:14] == ["assistant", ":", "hello", "there", "END"] and len(words) == 22
    ones = [i for i, m in enumerate(s.loss_mask) if m]
    assert ones == [11, 12, 13, 20, 21]  # the assistant's words and its END; not the "assistant :" header


def test_collate_shifts_the_mask_to_the_predicted_tokens(tok):
    s = tokenize_chat(tok, CHAT, "row 0")
    short = SFTSample([1, 4, 9], [0, 1, 1])
    b = collate([s, short], pad_token_id=0)
    assert b["responses"][0].tolist() == s.input_ids[1:]
    assert torch.nonzero(b["response_mask"][0]).flatten().tolist() == [10, 11, 12, 19, 20]
    assert b["response_mask"][1].tolist()[:3] == [1.0, 1.0, 0.0] and b["response_mask"][1].sum() == 2
    assert b["attention_mask"][1].tolist()[:4] == [1, 1, 1, 0]
    assert b["position_ids"][1].tolist()[:3] == [0, 1, 2]


def test_prompt_response_rows_and_bad_rows():
    cfg = load_sft_config([]).data
    assert row_messages({"question": "q", "answer": "a"}, cfg, "f row 3")[1] == {"role": "assistant", "content": "a"}
    with pytest.raises(DataError, match="f row 3: no column 'messages'"):
        row_messages({"text": "x"}, cfg, "f row 3")
    with pytest.raises(DataError, match="no assistant message"):
        row_messages({"messages": [{"role": "user", "content": "x"}]}, cfg, "f row 4")


def test_truncation():
    s = SFTSample([1, 2, 3, 4], [0, 0, 1, 1])
    assert truncate_sample(s, 3, "left", "r").input_ids == [2, 3, 4]
    assert truncate_sample(s, 3, "right", "r").loss_mask == [0, 0, 1]
    with pytest.raises(DataError, match="r: 4 tokens, longer than data.max_length=3"):
        truncate_sample(s, 3, "error", "r")


def test_config_keys_and_aliases():
    cfg = load_sft_config(["model.partial_pretrain=preset:tiny", "optim.lr_scheduler=constant",
                           "optim.warmup_steps_ratio=0.2"])
    assert (cfg.model.path, cfg.optim.lr_scheduler_type, cfg.optim.lr_warmup_steps_ratio) == ("preset:tiny",
                                                                                              "constant", 0.2)
    with pytest.raises(ConfigError, match="did you mean 'data.micro_batch_size_per_gpu'"):
        load_sft_config(["data.micro_batch_size_per_gpus=2"])
    with pytest.raises(ConfigError, match="data.truncation='middle'"):
        load_sft_config(["data.truncation=middle"])

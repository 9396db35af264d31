"""Bad SFT rows are one DataError line naming the file, the row and the field: a message without text
``content``, a null prompt / response, and a row whose assistant tokens ``data.truncation=right`` cuts
away (verl would train on it with no loss token; here it is refused).  Hand-written rows, a word-level
tokenizer (one token per word)."""

from __future__ import annotations

import json

import pytest
from word_tokenizer import word_tokenizer

from rlforge.config.sft import load_sft_config
from rlforge.data.sft_dataset import SFTSample, load_chats, tokenize_all, truncate_sample
from rlforge.errors import DataError

WORDS = ["<pad>", "user", "assistant", ":", "END", "hi", "hello", "x", "y"]
TEMPLATE = ("{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} END {% endfor %}"
            "{% if add_generation_prompt %}assistant : {% endif %}")


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(WORDS, TEMPLATE)


def _load(tmp_path, rows, *overrides):
    f = tmp_path / "chats.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_sft_config([f"data.train_files={f}", *overrides]).data
    return str(f), cfg, load_chats(cfg.train_files, cfg, "train", 1)


def _error(tmp_path, rows, *overrides) -> str:
    with pytest.raises(DataError) as e:
        _load(tmp_path, rows, *overrides)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


GOOD = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}


def test_a_message_without_content_names_file_row_and_message(tmp_path):
    msg = _error(tmp_path, [GOOD, {"messages": [{"role": "user"}, {"role": "assistant", "content": "y"}]}])
    assert msg.startswith(f"{tmp_path / 'chats.jsonl'} row 1: ")
    assert "data.messages_key='messages' message 0 ('user') has no 'content'" in msg


@pytest.mark.parametrize(("content", "got"), [(5, "of type int (5)"), (None, "a null 'content'"),
                                              (["y"], "of type list (['y'])")])
def test_a_message_whose_content_is_not_text_is_refused(tmp_path, content, got):
    msg = _error(tmp_path, [{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": content}]}])
    assert msg.startswith(f"{tmp_path / 'chats.jsonl'} row 0: ") and "message 1 ('assistant')" in msg and got in msg


def test_an_assistant_tool_call_may_leave_content_out(tmp_path):
    call = {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}
    _, _, (chats, _) = _load(tmp_path, [{"messages": [{"role": "user", "content": "x"}, call,
                                                      {"role": "assistant", "content": "y"}]}])
    assert chats[0].messages[1] == call


@pytest.mark.parametrize(("row", "field"), [({"question": None, "answer": "y"}, "'question' (data.prompt_key)"),
                                            ({"question": "x", "answer": None}, "'answer' (data.response_key)")])
def test_a_null_prompt_or_response_is_refused_not_trained_as_none(tmp_path, row, field):
    msg = _error(tmp_path, [{"question": "x", "answer": "y"}, row])
    assert msg == f"{tmp_path / 'chats.jsonl'} row 1: column {field} is null; give it text or drop the row"


def test_right_truncation_that_cuts_every_assistant_token_is_refused(tok, tmp_path):
    rows = [GOOD, {"messages": [{"role": "user", "content": "hi hi hi hi"}, {"role": "assistant", "content": "hello"}]}]
    f, cfg, (chats, origins) = _load(tmp_path, rows, "data.max_length=8", "data.truncation=right")
    # row 0: user : x END assistant : y END = 8 tokens, fits; row 1: user : hi hi hi hi END assistant : hello END
    # = 11 tokens, its 2 assistant tokens (hello END) at 9..10, past the cut at 8
    with pytest.raises(DataError) as e:
        tokenize_all(tok, chats, origins, cfg)
    assert str(e.value) == (f"{f} row 1: 11 tokens cut to data.max_length=8 (data.truncation=right) leave none of "
                            "its 2 assistant tokens to train on; raise data.max_length, or set data.truncation=error "
                            "to find such rows")
    # one loss token left after a cut is kept
    assert truncate_sample(SFTSample([1, 2, 3, 4], [0, 0, 1, 1]), 3, "right", "r").loss_mask == [0, 0, 1]


def test_an_unknown_role_is_refused_as_in_the_rl_data(tmp_path):
    msg = _error(tmp_path, [GOOD, {"messages": [{"role": "bogus", "content": "x"}, {"role": "assistant", "content": "y"}]}])
    assert msg == (f"{tmp_path / 'chats.jsonl'} row 1: data.messages_key='messages' message 0 has role 'bogus', "
                   "not one of system, user, assistant, tool")

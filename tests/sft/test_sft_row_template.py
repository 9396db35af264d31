"""Per-row chat-template inputs of SFT data (verl's ``MultiTurnSFTDataset``): a row's ``tools`` column
reaches the template as ``tools=``, its ``enable_thinking`` column overrides
``data.apply_chat_template_kwargs``, and the loss mask stays on the assistant turns.  Checked by hand with a
word-level tokenizer (one token per word) whose template renders both inputs."""

from __future__ import annotations

import json
import re

import pytest
from word_tokenizer import word_tokenizer

from rlforge.config.sft import load_sft_config
from rlforge.data.sft_dataset import load_chats, row_enable_thinking, row_tools, tokenize_all
from rlforge.errors import DataError

WORDS = ["<pad>", "system", "user", "assistant", ":", "END", "tools", "get_weather", "add", "nothink",
         "hi", "hello", "sunny", "ok"]
# Tools go into a system block first; with enable_thinking false every assistant turn carries an empty
# "nothink" marker right after its header (as Qwen3's empty <think></think>), generation prompt included.
TEMPLATE = ("{% set nt = enable_thinking is defined and not enable_thinking %}"
            "{% if tools %}system : tools {% for t in tools %}{{ t['name'] }} {% endfor %}END {% endif %}"
            "{% for m in messages %}{{ m['role'] }} : {% if m['role'] == 'assistant' and nt %}nothink {% endif %}"
            "{{ m['content'] }} END {% endfor %}"
            "{% if add_generation_prompt %}assistant : {% if nt %}nothink {% endif %}{% endif %}")
CHAT = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "ok"}, {"role": "assistant", "content": "sunny"}]
TOOLS = [{"name": "get_weather", "parameters": {"type": "object"}}, {"name": "add"}]


@pytest.fixture(scope="module")
def tok():
    return word_tokenizer(WORDS, TEMPLATE)


def _write(tmp_path, rows) -> str:
    f = tmp_path / "chats.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(f)


def _samples(tok, tmp_path, rows, *overrides):
    cfg = load_sft_config([f"data.train_files={_write(tmp_path, rows)}", *overrides]).data
    chats, origins = load_chats(cfg.train_files, cfg, "train", 1)
    return [([WORDS[i] for i in s.input_ids], [i for i, m in enumerate(s.loss_mask) if m])
            for s in tokenize_all(tok, chats, origins, cfg)]


def test_tools_reach_the_template_and_stay_out_of_the_mask(tok, tmp_path):
    rows = [{"messages": CHAT, "tools": TOOLS}, {"messages": CHAT, "tools": json.dumps(TOOLS)},
            {"messages": CHAT}, {"messages": CHAT, "tools": None}]
    (w0, m0), (w1, m1), (w2, m2), (w3, m3) = _samples(tok, tmp_path, rows)
    # 0 system 1 : 2 tools 3 get_weather 4 add 5 END 6 user 7 : 8 hi 9 END 10 assistant 11 : 12 hello 13 END
    # 14 user 15 : 16 ok 17 END 18 assistant 19 : 20 sunny 21 END
    assert w0[:6] == ["system", ":", "tools", "get_weather", "add", "END"] and len(w0) == 22
    assert m0 == [12, 13, 20, 21]
    assert (w1, m1) == (w0, m0)  # the JSON text of the list is the same tools
    assert w2 == w0[6:] and m2 == [6, 7, 14, 15]  # no column: no tools block
    assert (w3, m3) == (w2, m2)  # null: no tools
    # the whole render is the template's own, with the tools (an independent call)
    assert w0 == [WORDS[i] for i in tok.apply_chat_template(CHAT, tools=TOOLS, tokenize=True, return_dict=True)["input_ids"]]


def test_row_enable_thinking_overrides_the_config(tok, tmp_path):
    rows = [{"messages": CHAT, "enable_thinking": False}, {"messages": CHAT}, {"messages": CHAT, "enable_thinking": True}]
    (w0, m0), (w1, m1), (w2, m2) = _samples(tok, tmp_path, rows, "data.apply_chat_template_kwargs={enable_thinking: true}")
    # 0 user 1 : 2 hi 3 END 4 assistant 5 : 6 nothink 7 hello 8 END 9 user 10 : 11 ok 12 END
    # 13 assistant 14 : 15 nothink 16 sunny 17 END: the marker is part of the header, out of the mask
    assert w0[4:9] == ["assistant", ":", "nothink", "hello", "END"] and len(w0) == 18
    assert m0 == [7, 8, 16, 17]
    assert "nothink" not in w1 and m1 == [6, 7, 14, 15]  # no column: the config's (true)
    assert (w2, m2) == (w1, m1)
    (c0, _), (c1, n1), _ = _samples(tok, tmp_path, rows, "data.apply_chat_template_kwargs={enable_thinking: false}")
    assert c0 == w0 and "nothink" in c1 and n1 == m0  # no column: the config's (false) this time


def test_renamed_columns_and_verl_multiturn_aliases(tok, tmp_path):
    rows = [{"messages": CHAT, "tl": TOOLS, "think": False}]
    [(words, mask)] = _samples(tok, tmp_path, rows, "data.multiturn.tools_key=tl",
                               "data.multiturn.enable_thinking_key=think")
    assert words[:6] == ["system", ":", "tools", "get_weather", "add", "END"] and "nothink" in words
    assert mask == [13, 14, 22, 23]


@pytest.mark.parametrize(("value", "message"), [
    ("[{'name': 1}]", "f.jsonl row 2: column 'tools' (data.tools_key) is not valid JSON"),
    ("", None), ("[]", None),
    (5, "f.jsonl row 2: column 'tools' (data.tools_key) must be a list of tool schemas (objects) or its JSON "
        "text, got int"),
    ({"name": "add"}, "got dict"), (["add"], "got a list with a non-object item"), ('"add"', "got str"),
])
def test_bad_tools_name_the_row(value, message):
    if message is None:
        assert row_tools({"tools": value}, "tools", "f.jsonl row 2") is None
        return
    with pytest.raises(DataError, match=re.escape(message)):
        row_tools({"tools": value}, "tools", "f.jsonl row 2")


def test_bad_enable_thinking_names_the_row():
    assert row_enable_thinking({"enable_thinking": float("nan")}, "enable_thinking", "r") is None
    with pytest.raises(DataError, match=r"^f.jsonl row 4: column 'enable_thinking' \(data.enable_thinking_key\) "
                                        r"must be true, false or null, got 'yes' \(str\)"):
        row_enable_thinking({"enable_thinking": "yes"}, "enable_thinking", "f.jsonl row 4")
    with pytest.raises(DataError, match="got 1 \\(int\\)"):
        row_enable_thinking({"enable_thinking": 1}, "enable_thinking", "f.jsonl row 4")


def test_bad_tools_in_a_file_name_the_file_and_row(tok, tmp_path):
    rows = [{"messages": CHAT}, {"messages": CHAT, "tools": "{not json"}]
    with pytest.raises(DataError, match=r"chats.jsonl.*row.*data.tools_key\) is not valid JSON"):
        _samples(tok, tmp_path, rows)

"""Tool schemas in the prompt through the chat template's ``tools=`` argument (as verl's agent loop renders
them), and the fallback for templates that do not render tools (SmolLM2's)."""

from __future__ import annotations

import copy
import json
import logging
from pathlib import Path

from rlforge.data.dataset import RLDataset, template_renders_tools, tokenize_messages
from rlforge.data.tasks import BUILTIN_TASKS

CALC_SCHEMA = {"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression exactly.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}
# a ChatML template that lists the tools in the system turn (written for this test)
TOOLS_TEMPLATE = (
    "{%- if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0].role == 'system' %}"
    "{{ messages[0].content + '\\n\\n' }}{% endif %}{{ 'Tools:' }}{% for t in tools %}{{ '\\n' + (t | tojson) }}"
    "{% endfor %}{{ '<|im_end|>\\n' }}{% elif messages[0].role == 'system' %}"
    "{{ '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{% endif %}"
    "{%- for m in messages %}{% if not (loop.first and m.role == 'system') %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
ROW = {"data_source": "rlforge/arithmetic", "reward_model": {"ground_truth": "6"},
       "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 * 3?"}]}


def _ids(tok, text):
    return list(tok(text, add_special_tokens=False)["input_ids"])


def test_schemas_rendered_by_a_template_with_tools(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = TOOLS_TEMPLATE
    assert template_renders_tools(tok, [CALC_SCHEMA])
    ds = RLDataset([ROW], tok, 512, tools=[CALC_SCHEMA])
    assert ds.tools_rendered
    # the reference, written out: the system turn, the schema as JSON, the user turn, the generation prompt
    text = ("<|im_start|>system\nBe brief.\n\nTools:\n" + json.dumps(CALC_SCHEMA) + "<|im_end|>\n"
            "<|im_start|>user\nWhat is 2 * 3?<|im_end|>\n<|im_start|>assistant\n")
    assert ds[0]["input_ids"].tolist() == _ids(tok, text)
    # and the template's own rendering of the same messages and tools
    own = tok.apply_chat_template(ROW["prompt"], tools=[CALC_SCHEMA], add_generation_prompt=True, tokenize=False)
    assert own == text
    assert ds[0]["input_ids"].tolist() != tokenize_messages(tok, ROW["prompt"])  # without tools: no schema


def test_template_without_tools_falls_back_with_a_warning(tiny_tokenizer, caplog):
    rows = BUILTIN_TASKS.get("tool_arithmetic")(split="train", size=2, difficulty=1, seed=1)
    assert not template_renders_tools(tiny_tokenizer, [CALC_SCHEMA])  # SmolLM2's template ignores tools=
    with caplog.at_level(logging.WARNING, logger="rlforge.data.dataset"):
        ds = RLDataset(rows, tiny_tokenizer, 512, tools=[CALC_SCHEMA], source_name="data.train_files")
    assert not ds.tools_rendered and "does not render tool schemas" in caplog.text
    plain = RLDataset(rows, tiny_tokenizer, 512)
    assert [x["input_ids"].tolist() for x in ds.items] == [x["input_ids"].tolist() for x in plain.items]
    assert not template_renders_tools(tiny_tokenizer, [])


def test_prompt_tool_schemas_from_the_tool_config():
    from rlforge.config import load_config
    from rlforge.rollout.multi_turn.setup import prompt_tool_schemas
    from rlforge.tools import load_tools

    r = "actor_rollout_ref.rollout"
    on = load_config(overrides=[f"{r}.name=native", f"+{r}.multi_turn.enable=true",
                                f"+{r}.multi_turn.tool_config_path=builtin:calculator"])
    want = [t.tool_schema.to_openai() for t in load_tools("builtin:calculator").values()]
    assert prompt_tool_schemas(on) == want and want[0]["function"]["name"] == "calculator"
    import yaml

    import rlforge.tools

    with open(Path(rlforge.tools.__file__).parent / "configs" / "calculator.yaml") as f:
        assert want == [e["tool_schema"] for e in yaml.safe_load(f)["tools"]]  # the file's schema, as written
    assert prompt_tool_schemas(load_config(overrides=[f"{r}.name=native"])) is None  # multi_turn off

"""verl's tool / interaction config YAML: loads unchanged, and every mistake is one error naming the
file and the key, raised by config validation (before any model loads)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rlforge.config import load_config, validate_config
from rlforge.config.yaml_file import ConfigWarning
from rlforge.errors import ConfigError
from rlforge.interactions import load_interactions
from rlforge.rollout.multi_turn.config import MultiTurnConfig
from rlforge.tools import load_tools
from rlforge.tools.gsm8k import Gsm8kTool

# verl's examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml, in its shape
VERL_GSM8K = (Path(__file__).parent / "verl_gsm8k_tool_config.yaml").read_text()


def _write(tmp_path, text, name="tools.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_verl_gsm8k_tool_config_loads_and_scores(tmp_path):
    from rlforge.rollout.multi_turn.conversation import run_sync

    tools = load_tools(_write(tmp_path, VERL_GSM8K))
    tool = tools["calc_gsm8k_reward"]
    assert isinstance(tool, Gsm8kTool) and tool.tool_schema.required == ["answer"]
    iid, _ = run_sync(tool.create(None, ground_truth="72"))
    resp, _, _ = run_sync(tool.execute(iid, {"answer": "71"}))
    assert "reward=0.0" in resp.text
    run_sync(tool.execute(iid, {"answer": "72"}))
    assert run_sync(tool.calc_reward(iid)) == 1.0


@pytest.mark.parametrize("body, key", [
    (VERL_GSM8K.replace("verl.tools.gsm8k_tool.Gsm8kTool", "verl.tools.nope.NoTool"), "tools[0].class_name"),
    (VERL_GSM8K.replace("verl.tools.gsm8k_tool.Gsm8kTool", "Calculatr"), "tools[0].class_name"),
    (VERL_GSM8K.replace('type: "function"', 'type: "fn"'), "tools[0].tool_schema: type"),
    (VERL_GSM8K.replace('name: "calc_gsm8k_reward"', "name: 3"), "tools[0].tool_schema: function.name"),
    (VERL_GSM8K.replace('required: ["answer"]', 'required: ["answr"]'), "tools[0].tool_schema: function.parameters.required"),
    (VERL_GSM8K.replace('type: "object"', 'type: "array"'), "tools[0].tool_schema: function.parameters.type"),
    ("tools: {a: 1}", "tools:"),
    ("tools:\n  - {class_name: calculator, tool_schema: {function: {name: c}}, extra: 1}\n", "tools[0].extra"),
    ("tools: [: bad", "not valid YAML"),
])
def test_bad_tool_config_is_one_error_naming_file_and_key(tmp_path, body, key):
    path = _write(tmp_path, body)
    with pytest.raises(ConfigError) as e:
        load_tools(path)
    assert str(e.value).startswith(path) and key in str(e.value)


def test_validation_refuses_bad_tool_config_and_hf(tmp_path):
    path = _write(tmp_path, VERL_GSM8K.replace("verl.tools.gsm8k_tool.Gsm8kTool", "NoSuchTool"))
    r = "actor_rollout_ref.rollout"
    cfg = load_config(overrides=[f"{r}.name=native", f"+{r}.multi_turn.enable=true",
                                 f"+{r}.multi_turn.tool_config_path={path}"])
    with pytest.raises(ConfigError, match=f"{path}: tools\\[0\\].class_name"):
        validate_config(cfg)
    cfg = load_config(overrides=[f"{r}.name=hf", f"+{r}.multi_turn.enable=true"])
    with pytest.raises(ConfigError, match="rollout.name=native"):
        validate_config(cfg)
    # multi_turn is typed (verl's MultiTurnConfig): a typo is an unknown key when the config loads
    with pytest.raises(ConfigError, match=r"unknown config key 'actor_rollout_ref\.rollout\.multi_turn\."
                       r"max_asistant_turns'; did you mean 'actor_rollout_ref\.rollout\.multi_turn\.max_assistant_turns'"):
        load_config(overrides=[f"{r}.name=native", f"{r}.multi_turn.enable=true", f"{r}.multi_turn.max_asistant_turns=2"])
    with pytest.warns(ConfigWarning, match="ignoring '\\+actor_rollout_ref.rollout.multi_turn.max_asistant_turns"):
        load_config(overrides=[f"{r}.name=native", f"+{r}.multi_turn.max_asistant_turns=2"])
    # a MultiTurnConfig built from a mapping (not the schema) still names the closest key
    with pytest.raises(ConfigError, match="did you mean actor_rollout_ref.rollout.multi_turn.max_assistant_turns"):
        MultiTurnConfig.from_mapping({"max_asistant_turns": 2})


def test_multi_turn_keys_checked():
    assert MultiTurnConfig.from_mapping({"enable": True, "max_assistant_turns": 3}).max_assistant_turns == 3
    for bad in ({"max_parallel_calls": 0}, {"format": "json"}, {"tool_response_truncate_side": "top"},
                {"tool_timeout_s": 0}, {"enable": "yes"}, {"max_user_turns": 1.5}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            MultiTurnConfig.from_mapping(bad)


def test_interaction_config(tmp_path):
    good = _write(tmp_path, """
        interaction:
          - name: gsm8k
            class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction
            config: {}
        """, "i.yaml")
    assert list(load_interactions(good)) == ["gsm8k"]
    bad = _write(tmp_path, "interaction:\n  - {name: x, class_name: Nope}\n", "j.yaml")
    with pytest.raises(ConfigError, match=f"{bad}: interaction\\[0\\].class_name"):
        load_interactions(bad)

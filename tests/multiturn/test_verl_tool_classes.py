"""verl's tool classes with no rlforge counterpart get one line saying why (rlforge.tools.registry)."""

from __future__ import annotations

import pytest

from rlforge.errors import ConfigError
from rlforge.tools.registry import TOOLS, VERL_TOOLS_NOT_HERE, resolve_class


@pytest.mark.parametrize("name", sorted(VERL_TOOLS_NOT_HERE))
def test_verl_tools_without_a_counterpart_are_one_line(name):
    with pytest.raises(ConfigError) as e:
        resolve_class(name, TOOLS, "tools[0].class_name")
    assert str(e.value).startswith(f"tools[0].class_name: {name} is verl's") and "\n" not in str(e.value)


def test_verl_gsm8k_tool_resolves():
    assert resolve_class("verl.tools.gsm8k_tool.Gsm8kTool", TOOLS, "x") is TOOLS.get("gsm8k")

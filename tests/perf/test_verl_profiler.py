"""verl's ``global_profiler`` on rlforge's profiler: ``tool=torch`` with ``steps`` (and ``save_path``) records
those steps with torch.profiler; every other setting warns, naming its key."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import rlforge.config
from rlforge.config.later_work import later_work_warnings
from rlforge.errors import ConfigError
from rlforge.perf.monitor import PerfMonitor


def _trainer(**kw) -> SimpleNamespace:
    return SimpleNamespace(**{"profile": False, "profile_steps": None, "gpu_sample_interval_s": 0.0, **kw})


class _FakeProfile:
    """Stands for ``torch.profiler.profile`` (the real one takes seconds to start on a loaded CPU)."""

    def __init__(self, **kw) -> None:
        pass

    def __enter__(self) -> _FakeProfile:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def export_chrome_trace(self, path: str) -> None:
        with open(path, "w") as f:
            f.write("{}")


def test_global_profiler_torch_steps_reach_the_monitor(tmp_path, monkeypatch) -> None:
    import torch.profiler

    monkeypatch.setattr(torch.profiler, "profile", _FakeProfile)
    gp = {"tool": "torch", "steps": [2], "save_path": str(tmp_path / "prof")}
    mon = PerfMonitor.from_config(_trainer(profile_steps=[3]), 0, torch.device("cpu"), tmp_path / "run", gp)
    assert mon.profile_steps == {2, 3} and mon.torch_trace_dir == tmp_path / "prof"
    for step in (1, 2):
        with mon.step(step):
            torch.ones(3).sum()
    assert sorted(p.name for p in (tmp_path / "prof").iterdir()) == ["torch_rank0_step2.json"]
    # without tool=torch (verl profiles nothing without a tool) the steps are not recorded
    off = PerfMonitor.from_config(_trainer(), 0, torch.device("cpu"), tmp_path / "run", {"steps": [2]})
    assert off.profile_steps == frozenset() and off.torch_trace_dir == tmp_path / "run" / "trace"


def _warned(overrides: list[str], gp: dict) -> list[str]:
    """The warnings that setting ``gp`` on the command line adds (the user set those keys)."""
    base = set(later_work_warnings(rlforge.config.load_config(overrides)))
    mine = [f"global_profiler.{k}={json.dumps(v)}" for k, v in gp.items()]
    return [w for w in later_work_warnings(rlforge.config.load_config([*overrides, *mine])) if w not in base]


@pytest.mark.parametrize("gp, key", [
    ({"tool": "nsys", "steps": [1]}, "global_profiler.tool"),
    ({"tool": "torch"}, "global_profiler.tool"),  # no steps: nothing recorded
    ({"steps": [1]}, "global_profiler.steps"),  # no tool
    ({"save_path": "p"}, "global_profiler.save_path"),
    ({"tool": "torch", "steps": [1], "profile_continuous_steps": True}, "global_profiler.profile_continuous_steps"),
    ({"global_tool_config": {"torch_memory": {"stack_depth": 8}}}, "global_profiler.global_tool_config"),
])
def test_global_profiler_settings_without_effect_warn(gp, key) -> None:
    new = _warned([], gp)
    assert any(key in w for w in new), new


def test_global_profiler_is_typed_as_verl_types_it() -> None:
    with pytest.raises(ConfigError, match=r"unknown config key 'global_profiler\.made_up'"):
        rlforge.config.load_config(["global_profiler.made_up=1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'global_profiler\.global_tool_config\.nsys\.discret'; "
                                          r"did you mean 'global_profiler\.global_tool_config\.nsys\.discrete'"):
        rlforge.config.load_config(["global_profiler.global_tool_config.nsys.discret=true"])
    with pytest.raises(ConfigError, match=r"^global_profiler\.profile_continuous_steps: expected bool"):
        rlforge.config.load_config(["global_profiler.profile_continuous_steps=often"])
    # verl's nsys option dicts stay free-form, as in verl: a new option is accepted and warned
    new = _warned([], {"global_tool_config": {"nsys": {"worker_nsight_options": {"sample": "none"}}}})
    assert any("global_profiler.global_tool_config.nsys.worker_nsight_options.sample=none" in w for w in new), new


def test_global_profiler_in_effect_and_verl_defaults_are_quiet() -> None:
    verl_defaults = {"tool": None, "steps": None, "profile_continuous_steps": False, "save_path": None,
                     "global_tool_config": {"nsys": {"discrete": False}, "torch_memory": {"stack_depth": 32}}}
    assert _warned([], verl_defaults) == []
    assert _warned([], {"tool": "torch", "steps": [1, 2], "save_path": "out/prof"}) == []


def test_global_profiler_bad_steps_name_the_key() -> None:
    with pytest.raises(ConfigError, match=r"global_profiler\.steps"):
        PerfMonitor.from_config(_trainer(), 0, torch.device("cpu"), "run", {"tool": "torch", "steps": [0]})

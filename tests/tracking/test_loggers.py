"""Loggers: tensorboard read back from its event file; wandb and mlflow through fake modules
(neither is installed in CI) and their missing-package errors."""

from __future__ import annotations

import json
import math
import sys
import types
from pathlib import Path

import pytest

from rlforge.errors import ConfigError
from rlforge.tracking import LOGGERS, Tracking, check_loggers
from rlforge.tracking import base as tracking_base
from rlforge.tracking.mlflow_logger import mlflow_key

METRICS = [
    (1, {"timing_s/step": 1.5, "critic/score/mean": 0.25, "val-core/a/reward/mean@1": 0.5}),
    (2, {"timing_s/step": 1.25, "critic/score/mean": 0.75, "perf/idle_ratio": 0.1}),
]


def test_tensorboard_logger_writes_readable_scalars(tmp_path: Path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tr = Tracking(["file", "tensorboard"], tmp_path, "proj", "exp")
    for step, m in METRICS:
        tr.log(m, step)
    tr.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {"timing_s/step", "critic/score/mean", "val-core/a/reward/mean@1",
                                          "perf/idle_ratio"}
    got = {(e.step, e.value) for e in acc.Scalars("critic/score/mean")}
    assert got == {(1, 0.25), (2, 0.75)}
    assert [(e.step, e.value) for e in acc.Scalars("timing_s/step")] == [(1, 1.5), (2, 1.25)]
    # the file logger got the same metrics
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0] == {"step": 1, **METRICS[0][1]}


def _fake_module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


@pytest.fixture
def installed(monkeypatch):
    """Pretend every optional logger package is installed (the fakes replace the imports)."""
    monkeypatch.setattr(tracking_base, "find_spec", lambda name: object())
    return monkeypatch


def test_wandb_logger_runs_offline_in_the_run_dir(tmp_path: Path, installed):
    calls: dict[str, object] = {"log": []}

    class Run:
        def log(self, metrics, step):
            calls["log"].append((step, metrics))

        def finish(self):
            calls["finished"] = True

    def init(**kw):
        calls["init"] = kw
        return Run()

    installed.setitem(sys.modules, "wandb", _fake_module("wandb", init=init))
    installed.delenv("WANDB_MODE", raising=False)
    tr = Tracking(["wandb"], tmp_path, "proj", "exp", {"trainer": {"profile": True}})
    for step, m in METRICS:
        tr.log(m, step)
    tr.close()
    assert calls["init"] == {"project": "proj", "name": "exp", "dir": str(tmp_path), "mode": "offline",
                             "config": {"trainer": {"profile": True}}}
    assert calls["log"] == [(1, METRICS[0][1]), (2, METRICS[1][1])]
    assert calls["finished"] is True


def test_mlflow_logger_uses_a_file_store_and_valid_keys(tmp_path: Path, installed):
    calls: dict[str, object] = {"metrics": []}
    fake = _fake_module(
        "mlflow",
        set_tracking_uri=lambda uri: calls.__setitem__("uri", uri),
        set_experiment=lambda name: calls.__setitem__("experiment", name),
        start_run=lambda run_name: calls.__setitem__("run_name", run_name),
        log_dict=lambda d, name: calls.__setitem__("artifact", (d, name)),
        log_metrics=lambda m, step: calls["metrics"].append((step, m)),
        end_run=lambda: calls.__setitem__("ended", True),
    )
    installed.setitem(sys.modules, "mlflow", fake)
    installed.delenv("MLFLOW_TRACKING_URI", raising=False)
    tr = Tracking(["mlflow"], tmp_path, "proj", "exp", {"a": 1})
    tr.log(*reversed(METRICS[0]))
    tr.close()
    assert calls["uri"] == (tmp_path.resolve() / "mlruns").as_uri() and calls["uri"].startswith("file:")
    assert (calls["experiment"], calls["run_name"], calls["artifact"]) == ("proj", "exp", ({"a": 1}, "config.json"))
    assert calls["metrics"] == [(1, {"timing_s/step": 1.5, "critic/score/mean": 0.25,
                                     "val-core/a/reward/mean_at_1": 0.5})]
    assert calls["ended"] is True


def test_mlflow_key_sanitising():
    assert mlflow_key("val-core/openai/gsm8k/reward/mean@1") == "val-core/openai/gsm8k/reward/mean_at_1"
    assert mlflow_key("a(b)+c") == "a_b__c"


@pytest.mark.parametrize("name", ["tensorboard", "wandb", "mlflow"])
def test_missing_package_is_one_clear_error(name: str, monkeypatch):
    monkeypatch.setattr(tracking_base, "find_spec", lambda module: None)
    with pytest.raises(ConfigError, match=rf"trainer.logger={name} needs the '{name}' package.*pip install {name}"):
        check_loggers(["console", name])
    with pytest.raises(ConfigError, match=f"pip install {name}"):
        LOGGERS.get(name)(tracking_base.RunInfo(Path(".")))


def test_unknown_logger_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="mlflow.*tensorboard.*wandb"):
        check_loggers(["tensorbord"])


def test_non_finite_values_reach_tensorboard(tmp_path: Path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tr = Tracking(["tensorboard"], tmp_path)
    tr.log({"x": math.nan}, 1)
    tr.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert math.isnan(acc.Scalars("x")[0].value)


def test_console_line_shows_tool_and_judge_metrics() -> None:
    import io

    from rlforge.tracking.console import ConsoleLogger

    out = io.StringIO()
    ConsoleLogger(out).log({
        "critic/score/mean": 0.5, "reward/model_score/mean": 0.75, "reward/judge_parse_failure_rate": 0.125,
        "multi_turn/tool_calls/mean": 1.5, "multi_turn/truncated_ratio": 0.25,
        "multi_turn/tool/calculator/calls": 6.0, "multi_turn/tool/calculator/error": 2.0,
        "multi_turn/tool/calculator/timeout": 0.0, "multi_turn/tool/calculator/success": 4.0,
    }, step=3)
    assert out.getvalue() == (
        "step 3 | critic/score/mean: 0.5 | reward/model_score/mean: 0.75 | reward/judge_parse_failure_rate: 0.125 | "
        "multi_turn/tool_calls/mean: 1.5 | multi_turn/tool/calculator/error: 2 | multi_turn/truncated_ratio: 0.25\n")

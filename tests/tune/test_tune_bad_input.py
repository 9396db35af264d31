"""``rlforge tune`` with arguments that cannot mean anything: one error line, exit 2, no plan."""

from __future__ import annotations

import pytest
import torch

from rlforge.cli import main
from rlforge.errors import ConfigError
from rlforge.tune.cli import _layouts
from rlforge.tune.memcheck import measured_peaks
from rlforge.tune.shapes import model_shape

TINY = "actor_rollout_ref.model.path=preset:tiny"


@pytest.mark.parametrize("args, says", [
    (["--gpus", "0"], "--gpus 0: must be"),              # was: the CPU message, exit 0
    (["--gpus", "-1"], "--gpus -1: must be"),            # was: a table with FSDP -1 and negative seconds
    (["--gpus", "8", "--nnodes", "0"], "--nnodes 0"),   # was: planned as one node
    (["--gpus", "8", "--nnodes", "3"], "--nnodes 3"),   # 8 GPUs do not split over 3 nodes
    (["--nnodes", "2"], "give --gpus N too"),            # was: silently ignored
    (["--device-memory-gb", "0"], "--device-memory-gb 0.0"),   # was: taken as not given (the CPU)
    (["--device-memory-gb", "nan"], "--device-memory-gb nan"),
    (["--device-memory-gb", "-5"], "--device-memory-gb -5.0"),
    (["--check-memory", "/nonexistent/run"], "--check-memory /nonexistent/run: no run_config.yaml"),
    pytest.param(["--probe"], "--probe measures on this machine's GPU, and it has none",  # was: exit 0, no probe
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU to probe")),
])
def test_bad_tune_arguments_are_one_error(args, says, capsys):
    assert main(["tune", *args, TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlforge: error: ") and says in err[0]


def test_gpus_on_a_machine_without_any_asks_for_a_device(capsys, monkeypatch):
    from rlforge.tune import cli

    monkeypatch.setattr(cli, "detect", lambda: cli.SPECS["cpu"])
    assert main(["tune", "--gpus", "2", TINY]) == 2  # was: a plan for "2 x cpu"
    assert "--device h100" in capsys.readouterr().err


def test_layouts_keep_only_sizes_the_model_splits_into():
    # qwen2.5-0.5b: 14 heads, 2 KV heads, 24 layers -> TP 4 and TP 8 do not divide the heads
    shape = model_shape("preset:qwen2.5-0.5b")
    assert (shape.heads, shape.kv_heads, shape.layers) == (14, 2, 24)
    assert _layouts(8, 1, shape) == [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4)]
    seven = model_shape("preset:qwen2.5-7b")  # 28 heads, 4 KV heads: TP 8 does not divide 28
    assert (4, 2) in _layouts(8, 1, seven) and all(tp != 8 for tp, _ in _layouts(8, 1, seven))


def test_cannot_fit_names_the_device_size_it_would_take(capsys):
    assert main(["tune", "--device-memory-gb", "4", "actor_rollout_ref.model.path=preset:qwen2.5-7b"]) == 2
    err = capsys.readouterr().err
    assert "fake" not in err and "memory model's minimum is" in err and "a device of at least" in err


@pytest.mark.parametrize("text, says", [("3\n", "not a JSON object"), ('{"step": 1}\n', "no perf/max_memory")])
def test_metrics_without_memory_rows_are_one_error(tmp_path, text, says):
    f = tmp_path / "metrics.jsonl"
    f.write_text(text)  # a bare number was an AttributeError traceback; no memory rows an empty table
    with pytest.raises(ConfigError, match=says):
        measured_peaks(f)

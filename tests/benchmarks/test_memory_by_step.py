"""benchmarks/memory_by_step.py: the per-stage table and its MB/step slope, against hand-made rows."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "memory_by_step.py"


def _module():
    spec = importlib.util.spec_from_file_location("memory_by_step", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_slope_matches_hand_count() -> None:
    mod = _module()
    assert mod.slope([1.0, 2.0, 3.0], [1.0, 3.0, 5.0]) == pytest.approx(2.0)
    assert mod.slope([2.0, 3.0, 4.0, 5.0], [7.0, 7.0, 7.0, 7.0]) == 0.0
    assert mod.slope([1.0], [5.0]) == 0.0


def test_table_reports_growth_after_the_first_step(tmp_path, capsys) -> None:
    # gen grows 35 MB a step from step 2 on; update_actor holds still; step 1 jumps (one-time allocations)
    rows = [{"step": s, "perf/memory_allocated_gb/gen": 1.0 + (0.035 * (s - 1) if s > 1 else -0.5),
             "perf/memory_allocated_gb/update_actor": 2.0, "timing_s/step": 1.0} for s in range(1, 6)]
    f = tmp_path / "metrics.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in [{"step": 0, "val": 1.0}, *rows]))
    assert _module().main([str(f)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "| step | gen | update_actor |"
    assert out[2] == "| 1 | 0.500 | 2.000 |"
    assert out[-1] == "| MB/step after step 1 | +35.0 | +0.0 |"


def test_missing_file_and_cpu_run_get_one_message(tmp_path, capsys) -> None:
    mod = _module()
    assert mod.main([str(tmp_path / "nope.jsonl")]) == 1
    assert "no such file" in capsys.readouterr().err
    f = tmp_path / "metrics.jsonl"
    f.write_text(json.dumps({"step": 1, "timing_s/step": 1.0}) + "\n")
    assert mod.main([str(f)]) == 1
    assert "no perf/memory_allocated_gb/* metrics" in capsys.readouterr().err

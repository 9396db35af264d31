"""benchmarks/checkpoint_save.py: its CPU smoke run on preset:tiny prints the three rows, and each row left a
committed checkpoint of its format (the table reads real saves, not timings of nothing)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "checkpoint_save.py"


@pytest.mark.e2e
def test_cpu_smoke_run_prints_every_row_and_saves_each_format(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    res = subprocess.run([sys.executable, str(PATH), "--device", "cpu", "--model", "tiny", "--out", str(tmp_path), "--keep"],
                         capture_output=True, text=True, timeout=300, env={**env, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    lines = res.stdout.splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("format"))
    assert [ln.split()[0] for ln in lines[header + 1:header + 4]] == ["full", "dcp", "dcp-async"]
    for row in ("full", "dcp", "dcp-async"):
        assert (tmp_path / row / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert (tmp_path / "full" / "global_step_1" / "actor" / "state.pt").is_file()
    for row in ("dcp", "dcp-async"):
        assert (tmp_path / row / "global_step_1" / "actor" / ".metadata").is_file()


@pytest.mark.e2e
def test_rows_are_removed_after_measuring_unless_kept(tmp_path):
    """Without ``--keep`` each row's folder goes once measured (3B's rows fit the device's disk one at a time);
    its size is still in the table."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    res = subprocess.run([sys.executable, str(PATH), "--device", "cpu", "--model", "tiny", "--out", str(tmp_path),
                          "--rows", "full"], capture_output=True, text=True, timeout=300,
                         env={**env, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-3000:]
    row = next(ln for ln in res.stdout.splitlines() if ln.startswith("full "))
    assert float(row.split()[-1]) > 0  # disk_gb measured before the removal
    assert not (tmp_path / "full").exists()

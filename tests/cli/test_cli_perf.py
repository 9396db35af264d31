"""``rlforge perf report`` and the logger checks as a user meets them (a subprocess): a bad
run directory or a missing logger package is one ``rlforge: error:`` line and exit status 2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import user_error

pytestmark = pytest.mark.e2e

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlforge.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=120)


def test_report_of_a_missing_run_dir(tmp_path: Path):
    user_error(cli("perf", "report", str(tmp_path / "nope")), str(tmp_path / "nope"), "does not exist")


def test_report_names_file_and_line_of_a_malformed_metric(tmp_path: Path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "timing_s/step": 1.0}) + "\n{oops\n")
    user_error(cli("perf", "report", str(tmp_path)), str(tmp_path / "metrics.jsonl"), "line 2", "not valid JSON")


def test_report_writes_to_out(tmp_path: Path):
    pytest.importorskip("matplotlib")
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "timing_s/step": 1.0, "timing_s/gen": 0.6}) + "\n")
    res = cli("perf", "report", str(tmp_path), "--out", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "r" / "report.md").is_file() and (tmp_path / "r" / "stage_breakdown.png").is_file()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_train_with_wandb_missing_fails_before_loading_the_model(tmp_path: Path):
    res = cli("train", "actor_rollout_ref.model.path=preset:tiny", "trainer.device=cpu",
              "trainer.logger=[console,wandb]", f"trainer.default_local_dir={tmp_path}")
    user_error(res, "trainer.logger=wandb", "pip install wandb")

"""benchmarks/rm_throughput.py --smoke runs on the CPU and prints its table."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def test_rm_throughput_smoke(capsys) -> None:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "rm_throughput.py"
    spec = importlib.util.spec_from_file_location("rm_throughput", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--smoke", "--device", "cpu"])
    out = capsys.readouterr().out
    for row in ("rlforge stage", "rlforge resident", "transformers (baseline)", "scores/s", "tokens/s"):
        assert row in out, out

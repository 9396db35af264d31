"""benchmarks/rm_throughput.py --smoke runs on the CPU, prints its table, and its scores equal a plain forward."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest


@pytest.mark.e2e  # the whole benchmark, end to end
def test_rm_throughput_smoke(capsys) -> None:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "rm_throughput.py"
    spec = importlib.util.spec_from_file_location("rm_throughput", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.main(["--smoke", "--device", "cpu"])
    out = capsys.readouterr().out
    # the benchmark's scores against a plain unpadded forward of the same model on the same ids
    err = float(re.search(r"max \|score - unpadded forward\| = (\S+)$", out, re.M).group(1))
    assert err < 1e-4, out
    for row in ("rlforge stage", "rlforge resident", "transformers (baseline)"):
        cells = re.search(rf"^{re.escape(row)}\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)x$", out, re.M)
        assert cells is not None, out
        assert all(float(c) > 0 for c in cells.groups()), out  # scores/s, tokens/s, ms/iter, ratio

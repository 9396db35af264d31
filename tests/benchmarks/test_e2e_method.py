"""benchmarks/e2e_grpo.py's method: repetitions reduced to min/median/max, the median repetition
chosen by s/step, the ratio against the fastest TRL setup, and the generated-token rate."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "e2e_grpo.py"
_spec = importlib.util.spec_from_file_location("e2e_grpo", _PATH)
e2e = importlib.util.module_from_spec(_spec)
sys.modules["e2e_grpo"] = e2e
_spec.loader.exec_module(e2e)


def _run(fw: str, s: float, tps: float, **kw) -> dict:
    return {"model": "m", "framework": fw, "steps": 5, "s_per_step": s, "tokens_per_s": tps, "gen_s": s / 2,
            "train_s": s / 2, "gpu_util": None, "idle_ratio": None, "response_length_mean": 100.0, **kw}


def test_stats_hand_computed() -> None:
    assert e2e._stats([3.0, 1.0, 2.0]) == (1.0, 2.0, 3.0)
    assert e2e._stats([4.0, 1.0, 2.0, 3.0]) == (1.0, 2.5, 4.0)


def test_aggregate_picks_median_repetition_and_spreads() -> None:
    reps = [[_run("rlforge", 10.0, 100.0, tag="a"), _run("trl", 30.0, 40.0)],
            [_run("rlforge", 12.0, 90.0, tag="b"), _run("trl", 29.0, 41.0)],
            [_run("rlforge", 11.0, 95.0, tag="c"), {"model": "m", "framework": "trl", "error": "boom"}]]
    rows = e2e.aggregate(reps)
    assert rows[0]["tag"] == "c" and rows[0]["reps"] == 3  # s/step 10, 11, 12: the median one
    assert rows[0]["spread"]["tokens_per_s"] == (90.0, 95.0, 100.0)
    assert rows[1]["reps"] == 2 and rows[1]["spread"]["s_per_step"] == (29.0, 29.5, 30.0)  # the failed rep left out
    assert rows[1]["s_per_step"] == 29.0  # the lower middle of an even count
    table = e2e.spread_table(rows)
    assert "| m | rlforge | 3 | 90/95/100 |" in table


def test_ratio_uses_fastest_trl_variant_and_generated_rate() -> None:
    wl = e2e.Workload(prompts=4, n=2)
    runs = [e2e.with_generated_rate(_run("rlforge", 10.0, 120.0), wl), _run("trl", 30.0, 40.0),
            _run("trl-cb", 20.0, 60.0)]
    assert runs[0]["generated_tokens_per_s"] == pytest.approx(4 * 2 * 100.0 / 5.0)
    line = e2e.markdown_table(runs).splitlines()[2]
    assert line.rstrip(" |").endswith("2.00")  # 120 / 60, not 120 / 40


def test_unknown_trl_variant_is_one_error(capsys) -> None:
    sys_argv = sys.argv
    sys.argv = ["e2e_grpo.py", "--trl-variants", "trl,fast"]
    try:
        with pytest.raises(SystemExit) as exc:
            e2e.main()
    finally:
        sys.argv = sys_argv
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("--trl-variants: unknown ['fast']; valid: trl, trl-cb, trl-nockpt, trl-liger, trl-fast")

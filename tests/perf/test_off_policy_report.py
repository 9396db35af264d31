"""The off-policy section of ``rlforge perf report`` against hand-computed rows."""

from __future__ import annotations

from pathlib import Path

from rlforge.perf.off_policy import off_policy_section
from rlforge.perf.report import render_markdown
from rlforge.perf.run_data import RunData


def _row(step: int, frac: float, gap: float, g0: float, g1: float, **extra: float) -> dict[str, float]:
    return {"step": step, "timing_s/step": 1.0, "fully_async/staleness/off_policy_token_frac": frac,
            "fully_async/staleness/max_version_gap": gap, "fully_async/staleness/gap_0": g0,
            "fully_async/staleness/gap_1": g1, **extra}


def test_staleness_table_and_histogram_are_the_hand_computed_means():
    rows = [_row(1, 0.0, 0.0, 1.0, 0.0), _row(2, 0.5, 1.0, 0.5, 0.5, **{"rollout_corr/tis_mean": 0.9}),
            _row(3, 0.25, 2.0, 0.75, 0.0, **{"rollout_corr/tis_mean": 1.1}),
            {"step": 3, "val-core/x": 1.0}]  # a validation row: not a training step
    lines = off_policy_section(rows)
    table = {ln.split("|")[1].strip(): [c.strip() for c in ln.split("|")[2:5]] for ln in lines if ln.startswith("| `")}
    assert table["`fully_async/staleness/off_policy_token_frac`"] == ["0.25", "0.5", "0.25"]  # (0+.5+.25)/3
    assert table["`fully_async/staleness/max_version_gap`"] == ["1", "2", "2"]
    assert table["`rollout_corr/tis_mean`"] == ["1", "1.1", "1.1"]  # two steps logged it: (0.9+1.1)/2
    # gap 0: (1 + .5 + .75)/3 = 75%; gap 1: (0 + .5 + 0)/3 = 16.7%; bins no step logged: "-"
    assert "| share | 75% | 16.7% | - | - | - |" in lines


def test_no_section_without_off_policy_metrics_and_the_report_places_it():
    assert off_policy_section([{"step": 1, "timing_s/step": 1.0, "actor/pg_loss": 0.1}]) == []
    md = render_markdown(RunData(Path("run"), [_row(1, 0.5, 1.0, 0.5, 0.5)]), [])
    assert md.index("## Stages") < md.index("## Off-policy data") < md.index("## Plots")
    assert "## Off-policy data" not in render_markdown(RunData(Path("run"), [{"step": 1, "timing_s/step": 1.0}]), [])

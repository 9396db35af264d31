"""``rlforge perf report``: the files it writes, its table against the input, and its errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from trace_schema import check_trace_schema  # noqa: E402

from rlforge.cli import main  # noqa: E402
from rlforge.errors import DataError, RLForgeError  # noqa: E402
from rlforge.perf.report import write_report  # noqa: E402
from rlforge.perf.run_data import load_metrics  # noqa: E402

pytest.importorskip("matplotlib")

PLOT_FILES = ("stage_breakdown.png", "gpu_util.png", "timeline.png", "reward.png", "validation.png",
              "response_length.png")


def parse_table(md: str, header_start: str) -> dict[str, list[str]]:
    """Rows of the markdown table whose header starts with ``header_start``: first cell -> other cells."""
    lines = md.splitlines()
    i = next(k for k, line in enumerate(lines) if line.startswith(header_start))
    rows = {}
    for line in lines[i + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def num(cell: str) -> float | None:
    if cell == "-":
        return None
    return float(cell[:-1]) / 100 if cell.endswith("%") else float(cell)


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


HAND_ROWS = [
    {"step": 0, "val-core/a/reward/mean@1": 0.25, "timing_s/testing": 2.0},
    {"step": 1, "timing_s/step": 10.0, "timing_s/gen": 6.0, "timing_s/reward": 0.5, "timing_s/old_log_prob": 1.0,
     "timing_s/update_actor": 2.0, "perf/gpu_util/mean": 50.0, "perf/gpu_util/gen": 40.0,
     "perf/gpu_util/update_actor": 90.0, "perf/idle_ratio": 0.4, "perf/throughput": 1000.0,
     "perf/tokens_per_hour": 3.6e6, "critic/score/mean": 0.1, "response_length/mean": 100.0},
    {"step": 2, "timing_s/step": 14.0, "timing_s/gen": 8.0, "timing_s/reward": 0.5, "timing_s/old_log_prob": 1.5,
     "timing_s/update_actor": 3.0, "perf/gpu_util/mean": 60.0, "perf/gpu_util/gen": 50.0,
     "perf/idle_ratio": 0.2, "perf/throughput": 800.0, "perf/tokens_per_hour": 2.88e6, "critic/score/mean": "nan",
     "response_length/mean": 120.0, "timing_s/testing": 4.0, "val-core/a/reward/mean@1": 0.5},
]


def test_report_table_equals_hand_computed_values(tmp_path: Path):
    write_jsonl(tmp_path / "metrics.jsonl", HAND_ROWS)
    path = write_report(tmp_path)
    assert path == tmp_path / "report" / "report.md"
    md = path.read_text()
    stages = parse_table(md, "| stage |")
    approx = lambda x: pytest.approx(x, rel=1e-3)  # noqa: E731  (4 significant digits)
    # gen: (6 + 8) / 2 steps = 7 s; share 14 / 24; util mean(40, 50) = 45; idle 7 x 0.55
    assert [num(c) for c in stages["gen"]] == [approx(7.0), approx(14 / 24), approx(45.0), approx(7 * 0.55)]
    # update_actor: util only at step 1
    assert [num(c) for c in stages["update_actor"]] == [approx(2.5), approx(5 / 24), approx(90.0), approx(0.25)]
    assert [num(c) for c in stages["reward"]] == [approx(0.5), approx(1 / 24), None, None]
    # other = step - stages = (10 - 9.5) + (14 - 13) = 1.5 over 2 steps
    assert num(stages["other"][0]) == approx(0.75)
    assert [num(c) for c in stages["step"]] == [approx(12.0), approx(1.0), approx(55.0), approx(12 * 0.45)]
    # testing ran at steps 0 and 2 (outside the step): 6 s over 2 training steps, no share of the step
    assert [num(c) for c in stages["testing"][:2]] == [approx(3.0), None]
    assert list(stages) == ["gen", "reward", "old_log_prob", "update_actor", "other", "step", "testing"]
    summary = parse_table(md, "| metric |")
    assert num(summary["time per step (s)"][0]) == approx(12.0)
    assert num(summary["throughput (tokens/s/GPU)"][0]) == approx(900.0)
    assert num(summary["GPU utilisation (%)"][0]) == approx(55.0)
    # the hand rows carry no token counts: the mean of the per-step rates
    assert num(summary["tokens per hour (all ranks, over the steps)"][0]) == approx((3.6e6 + 2.88e6) / 2)
    assert num(summary["GPU idle ratio (samples < 5 % util)"][0]) == approx(0.3)
    assert summary["MFU, actor update"][0] == "-"
    assert "**Most time:** `gen`" in md and "**Most idle GPU time:** `gen`" in md
    for name in ("stage_breakdown.png", "gpu_util.png", "reward.png", "validation.png", "response_length.png"):
        assert (tmp_path / "report" / name).stat().st_size > 1000, name
        assert f"]({name})" in md
    # no trace: the timeline is skipped with a line saying why
    assert not (tmp_path / "report" / "timeline.png").exists()
    assert "Skipped: no stage trace: run with `trainer.profile=true`" in md


def test_plots_without_data_are_skipped_with_a_line(tmp_path: Path):
    write_jsonl(tmp_path / "metrics.jsonl", [{"step": 1, "timing_s/step": 1.0, "timing_s/gen": 0.5}])
    md = write_report(tmp_path, tmp_path / "out").read_text()
    assert (tmp_path / "out" / "stage_breakdown.png").exists()
    for fragment in ("no GPU utilisation", "no `critic/score/mean`", "no `val-core/.../mean@N`",
                     "no `response_length/mean`", "no stage trace"):
        assert f"Skipped: {fragment}" in md, fragment
    assert "No GPU utilisation in the metrics" in md


def test_gpu_samples_and_trace_are_plotted(tmp_path: Path):
    write_jsonl(tmp_path / "metrics.jsonl", HAND_ROWS)
    trace = tmp_path / "trace"
    trace.mkdir()
    write_jsonl(trace / "gpu_samples_rank0.jsonl",
                [{"time_s": 100.0 + 0.1 * i, "device": 0, "util_pct": float(i % 100), "memory_used_gb": 1.0}
                 for i in range(50)])
    events = [{"name": n, "ph": "X", "pid": 0, "tid": 0, "ts": 100e6 + a * 1e6, "dur": d * 1e6, "args": {"step": 1}}
              for n, a, d in (("step", 0, 4), ("gen", 0, 3), ("update_actor", 3, 1))]
    (trace / "rank0.json").write_text(json.dumps({"traceEvents": events}))
    md = write_report(tmp_path).read_text()
    assert (tmp_path / "report" / "timeline.png").exists() and "](timeline.png)" in md
    assert (tmp_path / "report" / "gpu_util.png").exists()


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        ('{"step": 1, "timing_s/step": 1.0}\n{"step": 2, "timing_s/st\n', "line 2: not valid JSON"),
        ('{"step": 1}\n[1, 2]\n', "line 2: expected a JSON object"),
        ('{"timing_s/step": 1.0}\n', "line 1: no integer 'step' field"),
        ('{"step": 1, "timing_s/step": "fast"}\n', "line 1: metric 'timing_s/step' is 'fast', not a number"),
        ("", "has no metrics"),
        ('{"step": 1, "timing_s/step": NaN}\n', "line 1: timing_s/step is nan; a stage time must be a finite number"),
        ('{"step": 1, "timing_s/gen": Infinity}\n', "line 1: timing_s/gen is inf"),
        ('{"step": 1, "timing_s/step": -5.0}\n', "line 1: timing_s/step is -5.0; a stage time must be a finite number"),
        ('{"step": 1, "timing_s/step": 1' + "0" * 400 + "}\n", "line 1: metric 'timing_s/step' is an integer too large"),
        ('{"step": 1}\n\udcff\n', "line 2: not a UTF-8 JSON-lines file"),
    ],
)
def test_malformed_metrics_name_file_and_line(tmp_path: Path, content: str, fragment: str):
    (tmp_path / "metrics.jsonl").write_bytes(content.encode("utf-8", "surrogateescape"))  # \udcff: the byte 0xff
    with pytest.raises(DataError) as e:
        load_metrics(tmp_path / "metrics.jsonl")
    assert str(tmp_path / "metrics.jsonl") in str(e.value) and fragment in str(e.value)


def test_missing_run_dir_and_metrics_file(tmp_path: Path):
    with pytest.raises(RLForgeError, match="does not exist"):
        write_report(tmp_path / "nope")
    with pytest.raises(RLForgeError, match=r"metrics.jsonl not found.*trainer.logger"):
        write_report(tmp_path)
    (tmp_path / "metrics.jsonl").mkdir()
    with pytest.raises(RLForgeError, match=r"metrics.jsonl is a directory"):
        write_report(tmp_path)


def test_missing_matplotlib_names_the_extra(tmp_path: Path, monkeypatch):
    write_jsonl(tmp_path / "metrics.jsonl", HAND_ROWS)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    with pytest.raises(RLForgeError, match=r"pip install 'rlforge\[bench\]'"):
        write_report(tmp_path)


@pytest.mark.e2e
def test_report_of_a_tiny_profiled_run(tmp_path: Path, capsys):
    """`rlforge train ... trainer.profile=true` then `rlforge perf report`: the report's numbers
    are the run's metrics, and the trace is a valid Trace Event Format file."""
    run = tmp_path / "run"
    rc = main(["train", "actor_rollout_ref.model.path=preset:tiny", "trainer.device=cpu",
               "trainer.total_training_steps=2", "trainer.logger=[console,file]", "trainer.profile=true",
               f"trainer.default_local_dir={run}", "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
               "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
               "data.max_response_length=4", "data.val_batch_size=4", "data.builtin.val_size=4",
               "data.builtin.train_size=16", "trainer.test_freq=1",
               "actor_rollout_ref.actor.recompute_old_log_prob=true"])  # on-policy batch: keep the stage
    assert rc == 0
    assert main(["perf", "report", str(run)]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "timing_s/step" in r]
    assert len(train) == 2
    for r in train:  # a CPU run: GPU metrics absent, not zero
        assert not any(k.startswith("perf/gpu_util") or k == "perf/idle_ratio" for k in r)
        assert r["perf/tokens_per_hour"] == pytest.approx(r["perf/total_num_tokens"] / r["timing_s/step"] * 3600)
    md = (run / "report" / "report.md").read_text()
    stages = parse_table(md, "| stage |")
    for stage in ("gen", "reward", "old_log_prob", "adv", "update_actor", "step"):
        expected = sum(r[f"timing_s/{stage}"] for r in train) / 2
        assert num(stages[stage][0]) == pytest.approx(expected, rel=1e-3), stage
    for name in ("stage_breakdown.png", "timeline.png", "reward.png", "validation.png", "response_length.png"):
        assert (run / "report" / name).exists(), name
    trace = json.loads((run / "trace" / "rank0.json").read_text())
    complete = check_trace_schema(trace)
    assert {e["name"] for e in complete} >= {"step", "gen", "reward", "old_log_prob", "update_actor", "testing"}
    assert sorted({e["args"]["step"] for e in complete}) == [0, 1, 2]
    for r in train:  # each step's trace durations are its timing_s values (µs vs s)
        step_events = [e for e in complete if e["args"]["step"] == r["step"] and e["name"] == "gen"]
        assert sum(e["dur"] for e in step_events) / 1e6 == pytest.approx(r["timing_s/gen"], rel=1e-4)


def test_unwritable_out_and_bad_trace_event_are_one_line_errors(tmp_path: Path):
    run = tmp_path / "run"
    (run / "trace").mkdir(parents=True)
    write_jsonl(run / "metrics.jsonl", HAND_ROWS)
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(RLForgeError, match="--out .*a_file/sub: cannot write there"):
        write_report(run, blocker / "sub")
    event = {"ph": "X", "name": "gen", "ts": "abc", "dur": 5, "pid": 0, "tid": 0}
    (run / "trace" / "rank0.json").write_text(json.dumps({"traceEvents": [event]}))
    with pytest.raises(DataError, match=r"rank0.json: traceEvents\[0\] \('gen'\) has ts='abc'"):
        write_report(run)


@pytest.mark.parametrize(("where", "content", "fragment"), [
    ("rank0.json", {"traceEvents": [{"ph": "X", "name": "gen", "ts": 0, "dur": 5, "args": {"step": "one"}}]},
     r"rank0.json: traceEvents\[0\] \('gen'\) has args=.*'step' is an integer"),
    ("rank0.json", {"traceEvents": [{"ph": "X", "name": "gen", "ts": 0, "dur": 5, "args": None}]},
     r"traceEvents\[0\] \('gen'\) has args=None"),
    ("rank0.json", {"traceEvents": [{"ph": "X", "ts": 0, "dur": 5}]}, r"traceEvents\[0\] has no name"),
    ("gpu_samples_rank0.jsonl", {"time_s": 1, "util_pct": "high"}, r"line 1: util_pct='high' is not a number"),
    ("gpu_samples_rank0.jsonl", {"time_s": float("nan"), "util_pct": 5}, r"line 1: time_s=nan is not a finite number"),
    ("rank0.json", {"traceEvents": [{"ph": "X", "name": "gen", "ts": 0, "dur": -1}]}, r"has dur=-1"),
])
def test_malformed_stage_trace_and_samples_are_one_line_errors(tmp_path: Path, where: str, content: dict,
                                                               fragment: str):
    """Fields the plots read are checked when the files are loaded (before any plot is drawn)."""
    (tmp_path / "trace").mkdir()
    write_jsonl(tmp_path / "metrics.jsonl", HAND_ROWS)
    (tmp_path / "trace" / where).write_text(json.dumps(content) + "\n")
    with pytest.raises(DataError, match=fragment):
        write_report(tmp_path)
    assert not (tmp_path / "report" / "stage_breakdown.png").exists()


def test_binary_stage_trace_is_a_one_line_error(tmp_path: Path):
    (tmp_path / "trace").mkdir()
    write_jsonl(tmp_path / "metrics.jsonl", HAND_ROWS)
    (tmp_path / "trace" / "rank0.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DataError, match=r"rank0.json: not a UTF-8 JSON trace file"):
        write_report(tmp_path)


def test_tokens_per_hour_is_the_runs_rate_not_the_mean_of_step_rates(tmp_path: Path):
    """1,000 tokens in 1 s and 1,000 tokens in 9 s: 2,000 tokens in 10 s = 720,000 per hour (the
    mean of the two step rates, 2.0e6, would overstate it)."""
    rows = [{"step": s, "timing_s/step": t, "perf/total_num_tokens": 1000.0, "perf/tokens_per_hour": 1000 / t * 3600}
            for s, t in ((1, 1.0), (2, 9.0))]
    write_jsonl(tmp_path / "metrics.jsonl", rows)
    summary = parse_table(write_report(tmp_path).read_text(), "| metric |")
    assert num(summary["tokens per hour (all ranks, over the steps)"][0]) == pytest.approx(720000, rel=1e-3)


def test_odd_files_beside_a_run_do_not_break_or_bend_the_report(tmp_path: Path):
    """An empty GPU-samples file (a run stopped before its first sample), a directory and a backup
    file named like rank traces are passed over; a NaN token count leaves the tokens-per-hour
    row on the mean of the per-step rates instead of spreading."""
    (tmp_path / "trace").mkdir()
    rows = [dict(r) for r in HAND_ROWS]
    rows[1]["perf/total_num_tokens"] = float("nan")
    rows[2]["perf/total_num_tokens"] = 1000.0
    write_jsonl(tmp_path / "metrics.jsonl", rows)
    (tmp_path / "trace" / "gpu_samples_rank0.jsonl").write_text("")
    (tmp_path / "trace" / "rank1.json").mkdir()
    (tmp_path / "trace" / "rank0.backup.json").write_text("not json")
    summary = parse_table(write_report(tmp_path).read_text(), "| metric |")
    assert num(summary["tokens per hour (all ranks, over the steps)"][0]) == pytest.approx((3.6e6 + 2.88e6) / 2,
                                                                                          rel=1e-3)

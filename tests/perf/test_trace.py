"""Stage recording through ``timed`` and the Chrome / Perfetto trace it exports."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from trace_schema import check_trace_schema  # noqa: E402

from rlforge.perf.gpu_sampler import GpuSample, GpuSampler  # noqa: E402
from rlforge.perf.monitor import PerfMonitor  # noqa: E402
from rlforge.perf.timer import timed  # noqa: E402
from rlforge.perf.trace import Timeline, chrome_trace  # noqa: E402


def test_timed_passes_its_interval_to_the_recorder():
    tl = Timeline(rank=2)
    tl.step = 7
    m: dict[str, float] = {}
    with timed("step", m, tl):
        with timed("gen", m, tl):
            pass
        with timed("gen", m, tl):
            pass
    assert [e.name for e in tl.events] == ["gen", "gen", "step"]
    gens = [e for e in tl.events if e.name == "gen"]
    assert m["timing_s/gen"] == pytest.approx(sum(e.end_s - e.start_s for e in gens))
    assert tl.stage_windows(7) == {"gen": [(g.start_s, g.end_s) for g in gens]}
    assert tl.stage_windows(8) == {}


def test_chrome_trace_schema_units_and_metadata():
    tl = Timeline(rank=3, clock=lambda: 0.0, wall_clock=lambda: 1000.0)  # offset: +1000 s
    tl.step = 1
    tl.record("step", 1.0, 3.0)
    tl.record("gen", 1.0, 1.5)
    tl.record("update_actor", 2.0, 2.999)
    samples = [GpuSample(1.25, ((80.0, 2e9, 300.0), (10.0, 1e9, 90.0)))]
    obj = json.loads(json.dumps(chrome_trace(tl.events, tl.rank, tl.offset_s, samples)))
    complete = check_trace_schema(obj)
    gen = next(e for e in complete if e["name"] == "gen")
    assert gen["ts"] == pytest.approx(1001.0 * 1e6) and gen["dur"] == pytest.approx(0.5e6)
    assert gen["pid"] == 3 and gen["args"] == {"step": 1}
    meta = {e["name"]: e["args"] for e in obj["traceEvents"] if e["ph"] == "M"}
    assert meta["process_name"] == {"name": "rank 3"}
    counters = [e for e in obj["traceEvents"] if e["ph"] == "C"]
    assert {c["name"] for c in counters} == {"gpu_util_pct", "gpu_memory_gb"}
    util = next(c for c in counters if c["name"] == "gpu_util_pct")
    assert util["args"] == {"gpu0": 80.0, "gpu1": 10.0} and util["ts"] == pytest.approx(1001.25e6)


def test_monitor_with_profile_writes_trace_and_samples(tmp_path: Path):
    clock_t = [0.0]
    sampler = GpuSampler(lambda: [(42.0, 3e9, 100.0)], clock=lambda: clock_t[0])
    sampler.start = lambda: sampler
    tl = Timeline(rank=1)
    mon = PerfMonitor(tl, sampler, tmp_path / "trace", profile=True)
    m: dict[str, float] = {}
    with mon.step(1), timed("step", m, tl), timed("gen", m, tl):
        pass
    clock_t[0] = tl.last("gen").start_s
    sampler.sample_once()
    mon.flush()
    mon.close()
    trace = json.loads((tmp_path / "trace" / "rank1.json").read_text())
    names = [e["name"] for e in check_trace_schema(trace)]
    assert names == ["gen", "step"]
    rows = [json.loads(x) for x in (tmp_path / "trace" / "gpu_samples_rank1.jsonl").read_text().splitlines()]
    assert len(rows) == 1 and rows[0]["util_pct"] == 42.0 and rows[0]["memory_used_gb"] == 3.0
    assert rows[0]["time_s"] == pytest.approx(tl.last("gen").start_s + tl.offset_s)

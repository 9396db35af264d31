"""``rlforge perf trace``: GPU busy/idle, gaps and their CPU explanation, kernel tables of a
``torch.profiler`` Chrome trace, against a hand-made trace and a real (CPU-only) one."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import user_error

from rlforge.errors import DataError
from rlforge.perf.report import render_markdown
from rlforge.perf.run_data import load_run
from rlforge.perf.torch_trace import summarize

CPU, GPU = {"pid": 100, "tid": 1}, {"pid": 0}


def ev(cat: str, name: str, ts: float, dur: float, **where) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **(where or CPU)}


# Times in microseconds. GPU busy: [20, 500] (gemm on stream 7 and attention on stream 8 overlap,
# then a D2H copy), [1500, 1800] (elementwise and NCCL), [2000, 2050] (memset).
# Gaps: [500, 1500] (aten::empty calling cudaMalloc, then aten::item), [1800, 2000], [0, 20].
HAND_EVENTS = [
    {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}},
    ev("Trace", "PyTorch Profiler (0)", -500, 5000, pid="Spans", tid="PyTorch Profiler"),  # not the window
    ev("cpu_op", "aten::addmm", 0, 100),
    ev("cuda_runtime", "cudaLaunchKernel", 10, 5),
    ev("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32", 20, 300, **GPU, tid=7),
    ev("kernel", "flash_fwd_kernel", 200, 200, **GPU, tid=8),
    ev("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 400, 100, **GPU, tid=7),
    ev("cpu_op", "aten::empty", 450, 650),
    ev("cpu_op", "aten::empty_strided", 460, 600),  # nested in aten::empty: not outermost
    ev("cuda_runtime", "cudaMalloc", 600, 400),
    ev("cpu_op", "aten::item", 1100, 500),
    ev("cuda_runtime", "cudaMemcpyAsync", 1150, 100),
    ev("kernel", "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>"
       + "x" * 40, 1500, 100, **GPU, tid=7),
    ev("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 1550, 250, **GPU, tid=8),
    ev("cpu_op", "aten::copy_", 1800, 250),
    ev("gpu_memset", "Memset (Device)", 2000, 50, **GPU, tid=7),
]


def write_trace(path: Path, events: list[dict]) -> Path:
    text = json.dumps({"schemaVersion": 1, "traceEvents": events})
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["t.json", "t.json.gz"])
def test_hand_made_trace_totals_gaps_and_kernels(tmp_path: Path, name: str):
    s = summarize(write_trace(tmp_path / name, HAND_EVENTS))
    assert s.window_source == "first to last event"
    assert (s.window_ms, s.busy_ms, s.idle_ms, s.num_device_events) == (2.05, 0.83, 1.22, 6)
    assert s.idle_fraction == pytest.approx(1.22 / 2.05)
    assert [(g.start_ms, g.dur_ms) for g in s.gaps] == [(0.5, 1.0), (1.8, 0.2), (0.0, 0.02)]
    first = s.gaps[0]
    assert first.runtime == (("cudaMalloc", 0.4), ("cudaMemcpyAsync", 0.1))
    assert first.cpu == (("aten::empty", 0.6), ("aten::item", 0.4))
    assert s.gaps[1].cpu == (("aten::copy_", 0.2),) and s.gaps[1].runtime == ()
    assert s.gaps[2].runtime == (("cudaLaunchKernel", 0.005),)
    cats = {r.name: (r.count, r.total_ms) for r in s.categories}
    assert cats == {"gemm/matmul": (1, 0.3), "nccl": (1, 0.25), "attention": (1, 0.2),
                    "memcpy/memset": (2, 0.15), "elementwise/other": (1, 0.1)}
    assert {r.name: r.share for r in s.categories}["gemm/matmul"] == pytest.approx(300 / 830)
    assert [r.name for r in s.kernels][:2] == ["sm90_xmma_gemm_bf16bf16_bf16f32",
                                               "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]
    limited = summarize(tmp_path / name, num_gaps=1, top_kernels=2, min_gap_ms=0.1)
    assert (len(limited.gaps), limited.num_gaps, len(limited.kernels)) == (1, 2, 2)


def test_profiler_step_span_is_the_window_and_not_an_explanation(tmp_path: Path):
    """The ``ProfilerStep#N`` span [0, 1700] plus the GPU work started in it (NCCL ends at 1800)."""
    step = ev("user_annotation", "ProfilerStep#3", 0, 1700)
    s = summarize(write_trace(tmp_path / "t.json", [step, *HAND_EVENTS]))
    assert s.window_source.startswith("1 `ProfilerStep#N` span")
    assert (s.window_ms, s.busy_ms) == (1.8, 0.78)
    assert [(g.start_ms, g.dur_ms) for g in s.gaps] == [(0.5, 1.0), (0.0, 0.02)]
    assert s.gaps[0].cpu == (("aten::empty", 0.6), ("aten::item", 0.4))


def test_real_cpu_only_profile_has_no_gpu_events(tmp_path: Path):
    from torch.profiler import ProfilerActivity, profile

    a = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            a = torch.tanh(a @ a)
    prof.export_chrome_trace(str(tmp_path / "cpu.json"))
    from rlforge.perf.torch_trace import render_markdown as render

    s = summarize(tmp_path / "cpu.json")
    assert s.num_device_events == 0 and s.busy_ms == 0 and s.gaps == [] and s.kernels == []
    assert s.window_ms > 0 and s.idle_fraction is None
    assert "No GPU events in this trace (a CPU-only run)" in render(s)


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlforge.cli", *args], capture_output=True, text=True,
                          env=ENV, timeout=120)


@pytest.mark.parametrize(("name", "content", "fragment"), [
    ("nope.json", None, "not found"),
    ("bad.json", b"{not json", "line 1: not valid JSON"),
    ("bin.json.gz", b"\x00\x01 not gzip", "not a JSON trace file"),
    ("events.json", b'{"events": []}', "expected a JSON object with a 'traceEvents' list"),
])
@pytest.mark.e2e
def test_cli_bad_file_is_a_one_line_error(tmp_path: Path, name: str, content: bytes | None, fragment: str):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    user_error(cli("perf", "trace", str(path)), str(path), fragment)


@pytest.mark.e2e
def test_cli_prints_tables_without_importing_torch(tmp_path: Path):
    path = write_trace(tmp_path / "t.json", HAND_EVENTS)
    res = cli("perf", "trace", str(path), "--gaps", "2", "--top", "3")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "GPU busy 0.83 ms, idle 1.22 ms (59.51 % idle)" in out
    assert ("| 1 | 0.5 | 1 | `cudaMalloc` 0.4, `cudaMemcpyAsync` 0.1 | `aten::empty` 0.6, `aten::item` 0.4 |"
            in out)
    assert "| gemm/matmul | 1 | 0.3 | 36.14% |" in out
    assert "2 of 3 gaps" in out and "| 3 |" not in out
    long_name = HAND_EVENTS[12]["name"]
    assert len(long_name) > 80 and long_name not in out
    assert f"| `{long_name[:77]}...` | 1 | 0.1 | 12.05% |" in cli("perf", "trace", str(path)).stdout
    code = ("import sys; from rlforge.cli import main; rc = main(['perf', 'trace', sys.argv[1]]); "
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules; sys.exit(rc)")
    res = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=ENV,
                         timeout=120)
    assert res.returncode == 0, res.stderr


def test_report_has_a_section_per_torch_trace(tmp_path: Path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "timing_s/step": 1.0}) + "\n")
    (tmp_path / "trace").mkdir()
    write_trace(tmp_path / "trace" / "torch_rank0_step2.json", HAND_EVENTS)
    write_trace(tmp_path / "trace" / "torch_rank0_step10.json", [ev("cpu_op", "aten::mm", 0, 10)])
    md = render_markdown(load_run(tmp_path), [])
    assert "## torch.profiler steps" in md
    step2, step10 = md.index("torch_rank0_step2.json"), md.index("torch_rank0_step10.json")
    assert step2 < step10  # by step, not by file name
    section = md[step2:step10]
    assert "#### Longest GPU idle gaps" in section and "3 of 3 gaps" in section
    assert "`cudaMalloc` 0.4" in section and "| nccl | 1 | 0.25 |" in section
    assert "No GPU events" in md[step10:]
    (tmp_path / "trace" / "torch_rank1_step2.json").write_text("[]")
    with pytest.raises(DataError, match=r"torch_rank1_step2.json: not a Chrome trace"):
        load_run(tmp_path)


@pytest.mark.parametrize(("name", "category"), [
    ("_paged_decode_kernel", "attention"),  # rlforge's Triton decode attention
    ("pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel", "attention"),
    ("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NNN", "gemm/matmul"),
    ("_silu_mul_kernel", "elementwise/other"),
])
def test_kernel_names_from_the_h200_traces(name: str, category: str):
    from rlforge.perf.torch_trace import kernel_category

    assert kernel_category(name, "kernel") == category


@pytest.mark.parametrize("bad", [{"dur": -10}, {"dur": None}, {}])
def test_kernel_without_a_valid_duration_is_an_error(tmp_path: Path, bad: dict):
    """A missing or negative ``dur`` would silently shrink GPU busy time: refused, naming the event."""
    kernel = {k: v for k, v in ev("kernel", "k1", 0, 30, **GPU).items() if k != "dur"} | bad
    path = write_trace(tmp_path / "t.json", [kernel, ev("kernel", "k2", 40, 10, **GPU)])
    with pytest.raises(DataError, match=r"traceEvents\[0\] \('k1'\).*dur >= 0"):
        summarize(path)


def test_gpu_work_outside_the_step_window_is_left_out(tmp_path: Path):
    """With ``ProfilerStep#N`` spans, kernels that start before the window count nowhere."""
    path = write_trace(tmp_path / "t.json", [
        ev("user_annotation", "ProfilerStep#1", 0, 100),
        ev("kernel", "early", -100, 50, **GPU, tid=7),
        ev("kernel", "k", 50, 50, **GPU, tid=7),
    ])
    s = summarize(path)
    assert (s.num_device_events, s.busy_ms, s.window_ms) == (1, 0.05, 0.1)
    assert [(r.name, r.count, r.share) for r in s.categories] == [("elementwise/other", 1, 1.0)]


def test_odd_kernel_names_stay_on_one_table_row(tmp_path: Path):
    from rlforge.perf.torch_trace import render_markdown as render

    path = write_trace(tmp_path / "t.json", [ev("kernel", "two\nlines|\ud800", 0, 10, **GPU)])
    md = render(summarize(path))
    assert "| `two lines\\|?` | 1 | 0.01 | 100% |" in md


@pytest.mark.e2e
@pytest.mark.parametrize("value", ["nan", "inf", "-1", "abc"])
def test_cli_refuses_a_minimum_gap_that_is_not_a_finite_non_negative_number(tmp_path: Path, value: str):
    path = write_trace(tmp_path / "t.json", HAND_EVENTS)
    res = cli("perf", "trace", str(path), "--min-gap-ms", value)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert f"argument --min-gap-ms: '{value}' is not a duration" in res.stderr

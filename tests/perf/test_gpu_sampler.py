"""The GPU sampler's arithmetic on hand-made samples from a fake reading source (no GPU needed)."""

from __future__ import annotations

import math
import time

import pytest

from rlforge.perf.gpu_sampler import GpuSample, GpuSampler, gpu_step_metrics, local_gpu_reader, util_stats
from rlforge.perf.monitor import PerfMonitor
from rlforge.perf.timer import timed
from rlforge.perf.trace import Timeline


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def scripted_source(readings: list[list[tuple[float, float, float]]]):
    """A reading source returning the given per-device readings, one list per call."""
    it = iter(readings)
    return lambda: next(it)


def sample(t: float, *utils: float, mem: float = 2e9, power: float = 100.0) -> GpuSample:
    return GpuSample(t, tuple((u, mem, power) for u in utils))


def test_util_stats_pools_devices_and_windows():
    samples = [sample(0.0, 0.0, 100.0), sample(1.0, 50.0, 4.0), sample(2.0, 80.0, 90.0), sample(3.0, 10.0, 10.0)]
    st = util_stats(samples, [(0.0, 1.0)])
    # samples at t=0 and t=1, two devices each: utils 0, 100, 50, 4
    assert st.num_samples == 4
    assert st.util_mean == pytest.approx((0 + 100 + 50 + 4) / 4)
    assert st.idle_ratio == pytest.approx(2 / 4)  # 0 and 4 are below 5 %
    assert st.memory_used_gb == pytest.approx(2.0)
    assert st.power_w == pytest.approx(100.0)
    # two disjoint windows pool their samples: t=0 and t=3
    st2 = util_stats(samples, [(-0.5, 0.5), (2.5, 3.5)])
    assert st2.util_mean == pytest.approx((0 + 100 + 10 + 10) / 4)
    assert st2.idle_ratio == pytest.approx(1 / 4)
    assert util_stats(samples, [(10.0, 11.0)]) is None


def test_idle_threshold_is_strict_and_configurable():
    samples = [sample(0.0, 5.0), sample(1.0, 4.99), sample(2.0, 20.0)]
    assert util_stats(samples, [(0, 2)]).idle_ratio == pytest.approx(1 / 3)
    assert util_stats(samples, [(0, 2)], idle_threshold=25.0).idle_ratio == pytest.approx(1.0)


def test_step_metrics_per_stage_and_absent_when_no_sample():
    # a 1 s step sampled every 0.1 s: gen 0.0-0.6 busy, update 0.6-1.0 idle-ish
    utils = [90, 95, 100, 85, 90, 95, 0, 2, 60, 3, 1]
    samples = [sample(round(0.1 * i, 1), u, power=math.nan) for i, u in enumerate(utils)]
    stages = {"gen": [(0.0, 0.55)], "update_actor": [(0.55, 1.0)], "adv": [(0.551, 0.552)]}
    m = gpu_step_metrics(samples, (0.0, 1.0), stages)
    assert m["perf/gpu_util/mean"] == pytest.approx(sum(utils) / 11)
    assert m["perf/idle_ratio"] == pytest.approx(4 / 11)  # 0, 2, 3, 1
    assert m["perf/gpu_util/gen"] == pytest.approx((90 + 95 + 100 + 85 + 90 + 95) / 6)
    assert m["perf/gpu_util/update_actor"] == pytest.approx((0 + 2 + 60 + 3 + 1) / 5)
    assert "perf/gpu_util/adv" not in m  # no sample fell in that 1 ms stage
    assert "perf/gpu_power_w" not in m  # power not reported
    assert m["perf/gpu_memory_used_gb"] == pytest.approx(2.0)
    assert gpu_step_metrics([], (0.0, 1.0), stages) == {}


def test_sampler_keeps_samples_with_injected_clock():
    clock = FakeClock()
    s = GpuSampler(scripted_source([[(10.0, 1e9, 50.0)], [(20.0, 2e9, 60.0)], [(30.0, 3e9, 70.0)]]), clock=clock)
    for t in (0.0, 0.1, 0.2):
        clock.t = t
        s.sample_once()
    assert [x.readings[0][0] for x in s.samples(0.05, 0.25)] == [20.0, 30.0]
    s.discard_before(0.1)
    assert [x.time_s for x in s.samples()] == [0.1, 0.2]


def test_sampler_thread_samples_and_reports_its_cpu_time():
    calls = []

    def read():
        calls.append(1)
        return [(50.0, 1e9, 10.0)]

    with GpuSampler(read, interval_s=0.01) as s:
        time.sleep(0.2)
    n = len(calls)
    assert n >= 3 and len(s.samples()) == n
    assert 0.0 < s.cpu_time_s() < 0.2
    time.sleep(0.05)
    assert len(calls) == n  # stopped


def test_sampler_thread_stops_after_repeated_read_errors():
    def read():
        raise RuntimeError("driver gone")

    s = GpuSampler(read, interval_s=0.001)
    with pytest.warns(UserWarning, match="GPU sampling stopped after 10 failed reads"):
        s.start()
        s._thread.join(timeout=5)
    s.stop()
    assert s.samples() == []


def test_no_reader_without_gpu():
    assert local_gpu_reader("cpu", [0]) is None


def test_monitor_step_metrics_from_timed_stages(tmp_path):
    """timed() -> Timeline -> per-stage windows -> GPU metrics, with a fake sampler clock."""
    clock = FakeClock()
    sampler = GpuSampler(lambda: [(0.0, 0.0, 0.0)], clock=clock)
    sampler.start = lambda: sampler  # drive it by hand
    tl = Timeline(rank=0)
    mon = PerfMonitor(tl, sampler, tmp_path / "trace")
    m: dict[str, float] = {}
    with mon.step(3), timed("step", m, tl), timed("gen", m, tl):
        pass
    gen = tl.last("gen")
    step = tl.last("step")
    assert gen.step == 3 and step.start_s <= gen.start_s <= gen.end_s <= step.end_s
    # hand-placed samples: one inside gen (util 80), one in the step after gen (util 0)
    sampler._samples = [sample(gen.start_s + (gen.end_s - gen.start_s) / 2, 80.0),
                        sample(step.end_s, 0.0), sample(step.end_s + 1.0, 100.0)]
    out = mon.step_metrics()
    assert out["perf/gpu_util/gen"] == pytest.approx(80.0)
    assert out["perf/gpu_util/mean"] == pytest.approx(40.0)
    assert out["perf/idle_ratio"] == pytest.approx(0.5)
    assert "perf/gpu_sampler_overhead" in out and out["perf/gpu_sampler_overhead"] >= 0.0
    assert m["timing_s/step"] >= m["timing_s/gen"]


def test_monitor_without_sampler_gives_no_gpu_metrics(tmp_path):
    tl = Timeline()
    mon = PerfMonitor(tl, None, tmp_path / "trace")
    m: dict[str, float] = {}
    with timed("step", m, tl):
        pass
    assert mon.step_metrics() == {} and mon.stage_metrics("testing") == {}
    mon.flush()
    assert tl.events == []  # not profiling: nothing kept between steps
    assert not (tmp_path / "trace").exists()


class _NVMLError(Exception):
    pass


def fake_pynvml(fail_init: bool = False):
    """A stand-in for ``pynvml`` with 4 devices; device j reads util 10*j %, j GB, and no power."""
    import types

    def init():
        if fail_init:
            raise _NVMLError("Driver Not Loaded")

    def power(h):
        raise _NVMLError("Not Supported")

    return types.SimpleNamespace(
        NVMLError=_NVMLError, nvmlInit=init, nvmlDeviceGetCount=lambda: 4, nvmlDeviceGetHandleByIndex=lambda j: j,
        nvmlDeviceGetUUID=lambda h: f"GPU-uuid-{h}",
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=10 * h),
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=h * 1e9), nvmlDeviceGetPowerUsage=power,
    )


def test_nvml_reader_maps_visible_devices_and_reads(monkeypatch):
    import sys

    from rlforge.perf.gpu_sampler import nvml_reader

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")  # no CUDA here: matched by this list, not by UUID
    read = nvml_reader([0, 1])
    out = read()
    assert [r[:2] for r in out] == [(30.0, 3e9), (10.0, 1e9)]
    assert all(math.isnan(r[2]) for r in out)  # power not supported -> NaN, not an error


def test_nvml_reader_absent_without_driver_or_package(monkeypatch):
    import sys

    from rlforge.perf.gpu_sampler import nvml_reader

    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(fail_init=True))
    with pytest.warns(UserWarning, match="NVML failed to start"):
        assert nvml_reader([0]) is None
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.warns(UserWarning, match="pip install nvidia-ml-py"):
        assert nvml_reader([0]) is None

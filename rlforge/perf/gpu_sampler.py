"""GPU sampling: utilisation, memory and power of the local GPUs, read about every 100 ms
on a background thread, and the per-step statistics made from the samples.

Definitions (the metric names are in :func:`gpu_step_metrics`):

- **utilisation** is NVML's ``nvmlDeviceGetUtilizationRates().gpu``: the percentage of the
  driver's last sample period (between 1/6 s and 1 s, by product) during which at least
  one kernel was running on the GPU.  It says nothing about how full the GPU was.
- **idle**: a sample of one device is idle when its utilisation is below
  :data:`IDLE_UTIL_PCT` (5 %).  ``perf/idle_ratio`` is the fraction of the step's
  (sample, device) pairs that are idle.  Samples are evenly spaced in time, so this
  estimates the fraction of the step's wall time during which the GPU ran (almost) nothing.
- A sample belongs to the stage whose interval contains the sample's time.  NVML's value
  looks back one driver period, so a stage shorter than that period is smeared into its
  neighbours, and a stage with no sample in it gets no ``perf/gpu_util/<stage>``.

The reading source is any callable returning one ``(util %, memory used bytes, power W)``
per device, so the arithmetic is tested with a fake source; :func:`nvml_reader` is the
real one (``nvidia-ml-py``, imported lazily).  Without a GPU there is no source and the
metrics are absent, not zero.
"""

from __future__ import annotations

import math
import os
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rlforge.errors import RLForgeWarning

IDLE_UTIL_PCT = 5.0
"""A device sample with utilisation below this (percent) counts as idle."""

GpuReading = tuple[float, float, float]
"""One device's ``(utilisation %, memory used bytes, power W)``; power may be NaN (not supported)."""

ReadFn = Callable[[], Sequence[GpuReading]]
"""Returns one :data:`GpuReading` per sampled device, in a fixed device order."""

Window = tuple[float, float]
"""A ``(start_s, end_s)`` interval in the sampler's clock (``time.perf_counter`` seconds)."""


@dataclass(frozen=True)
class GpuSample:
    """The readings of every sampled device at one time."""

    time_s: float
    """Sampler clock (``time.perf_counter()`` seconds, unless another clock is injected)."""
    readings: tuple[GpuReading, ...]
    """One reading per device."""


class GpuSampler:
    """Reads ``read()`` every ``interval_s`` seconds on a daemon thread and keeps the samples.

    Args:
        read: the reading source (:func:`nvml_reader`, or a fake in tests).
        interval_s: seconds between samples (> 0).
        clock: time source, in seconds; must be the clock of the stage intervals.

    Use as a context manager, or call :meth:`start` and :meth:`stop`.  :meth:`sample_once`
    takes one sample on the calling thread (tests drive the sampler with it).
    """

    MAX_CONSECUTIVE_ERRORS = 10

    def __init__(self, read: ReadFn, interval_s: float = 0.1, clock: Callable[[], float] = time.perf_counter) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self._read = read
        self.interval_s = float(interval_s)
        self._clock = clock
        self._samples: list[GpuSample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_s = 0.0

    def start(self) -> GpuSampler:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="rlforge-gpu-sampler", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 1.0)
            self._thread = None

    def __enter__(self) -> GpuSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        errors = 0
        while not self._stop.is_set():
            try:
                self.sample_once()
                errors = 0
            except Exception as e:  # a driver hiccup must not kill training
                errors += 1
                if errors >= self.MAX_CONSECUTIVE_ERRORS:
                    warnings.warn(f"GPU sampling stopped after {errors} failed reads: {e}", RLForgeWarning, stacklevel=1)
                    return
            finally:
                self._cpu_s = time.thread_time()
            self._stop.wait(self.interval_s)

    def sample_once(self) -> GpuSample:
        """Read every device now and keep the sample."""
        readings = tuple((float(u), float(m), float(p)) for u, m, p in self._read())
        sample = GpuSample(self._clock(), readings)
        with self._lock:
            self._samples.append(sample)
        return sample

    def samples(self, start_s: float = -math.inf, end_s: float = math.inf) -> list[GpuSample]:
        """The kept samples with ``start_s <= time_s <= end_s``, oldest first."""
        with self._lock:
            return [s for s in self._samples if start_s <= s.time_s <= end_s]

    def discard_before(self, time_s: float) -> None:
        """Forget samples older than ``time_s`` (keeps memory bounded over a long run)."""
        with self._lock:
            self._samples = [s for s in self._samples if s.time_s >= time_s]

    def cpu_time_s(self) -> float:
        """CPU seconds the sampling thread has used so far (its own thread time)."""
        return self._cpu_s


@dataclass(frozen=True)
class UtilStats:
    """Statistics of the samples that fall in a set of windows, pooled over devices."""

    util_mean: float
    """Mean utilisation, percent."""
    idle_ratio: float
    """Fraction of (sample, device) pairs with utilisation below the idle threshold, in [0, 1]."""
    memory_used_gb: float
    """Mean memory used (every process on the device), 1e9 bytes."""
    power_w: float
    """Mean power draw, watts; NaN when the device does not report power."""
    num_samples: int
    """Number of (sample, device) pairs."""


def _in_windows(t: float, windows: Sequence[Window]) -> bool:
    return any(a <= t <= b for a, b in windows)


def util_stats(
    samples: Sequence[GpuSample], windows: Sequence[Window], idle_threshold: float = IDLE_UTIL_PCT
) -> UtilStats | None:
    """Pool the readings of every sample whose time lies in one of ``windows``; None if none does."""
    readings = [r for s in samples if _in_windows(s.time_s, windows) for r in s.readings]
    if not readings:
        return None
    n = len(readings)
    powers = [p for _, _, p in readings if math.isfinite(p)]
    return UtilStats(
        util_mean=sum(u for u, _, _ in readings) / n,
        idle_ratio=sum(1 for u, _, _ in readings if u < idle_threshold) / n,
        memory_used_gb=sum(m for _, m, _ in readings) / n / 1e9,
        power_w=sum(powers) / len(powers) if powers else math.nan,
        num_samples=n,
    )


def gpu_step_metrics(
    samples: Sequence[GpuSample], step: Window, stages: dict[str, list[Window]],
    idle_threshold: float = IDLE_UTIL_PCT,
) -> dict[str, float]:
    """Per-step GPU metrics; keys are absent when no sample falls in their interval.

    - ``perf/gpu_util/mean``: mean utilisation (%) over the step's wall time;
    - ``perf/gpu_util/<stage>``: the same over each stage's intervals (a stage that ran
      several times in the step pools all of them);
    - ``perf/idle_ratio``: fraction of the step's samples with utilisation < ``idle_threshold`` %;
    - ``perf/gpu_memory_used_gb``, ``perf/gpu_power_w``: means over the step.
    """
    out: dict[str, float] = {}
    whole = util_stats(samples, [step], idle_threshold)
    if whole is None:
        return out
    out["perf/gpu_util/mean"] = whole.util_mean
    out["perf/idle_ratio"] = whole.idle_ratio
    out["perf/gpu_memory_used_gb"] = whole.memory_used_gb
    if math.isfinite(whole.power_w):
        out["perf/gpu_power_w"] = whole.power_w
    for name, windows in stages.items():
        st = util_stats(samples, windows, idle_threshold)
        if st is not None:
            out[f"perf/gpu_util/{name}"] = st.util_mean
    return out


def nvml_reader(cuda_indices: Sequence[int]) -> ReadFn | None:
    """An NVML reading source for the given CUDA device indices (as torch numbers them),
    or None when ``nvidia-ml-py`` is missing or NVML cannot start (no driver).

    CUDA indices are matched to NVML devices by UUID, so ``CUDA_VISIBLE_DEVICES`` is honoured.
    """
    try:
        import pynvml
    except ImportError:
        warnings.warn("GPU utilisation is not sampled: the nvidia-ml-py package is missing "
                      "(pip install nvidia-ml-py)", category=RLForgeWarning, stacklevel=2)
        return None
    try:
        pynvml.nvmlInit()
        handles = [_nvml_handle(pynvml, i) for i in cuda_indices]
    except pynvml.NVMLError as e:
        warnings.warn(f"GPU utilisation is not sampled: NVML failed to start ({e})", RLForgeWarning,
                      stacklevel=2)
        return None

    def power_w(h: Any) -> float:
        try:
            return pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0  # milliwatts
        except pynvml.NVMLError:
            return math.nan

    def read() -> list[GpuReading]:
        return [
            (float(pynvml.nvmlDeviceGetUtilizationRates(h).gpu), float(pynvml.nvmlDeviceGetMemoryInfo(h).used),
             power_w(h))
            for h in handles
        ]

    return read


def _nvml_handle(pynvml: Any, cuda_index: int) -> Any:
    """The NVML handle of torch's CUDA device ``cuda_index``: matched by UUID; failing that, by
    the entry of a numeric ``CUDA_VISIBLE_DEVICES``, or by position."""
    import torch

    try:
        want = str(torch.cuda.get_device_properties(cuda_index).uuid).removeprefix("GPU-")
        for j in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(j)
            uuid = pynvml.nvmlDeviceGetUUID(h)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            if uuid.removeprefix("GPU-") == want:
                return h
    except Exception:  # an old driver or torch without .uuid: fall back below
        pass
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if cuda_index < len(visible) and visible[cuda_index].isdigit():
        return pynvml.nvmlDeviceGetHandleByIndex(int(visible[cuda_index]))
    return pynvml.nvmlDeviceGetHandleByIndex(cuda_index)


def local_gpu_reader(device_type: str, cuda_indices: Sequence[int]) -> ReadFn | None:
    """:func:`nvml_reader` for CUDA devices; None on any other device (the metrics are then absent)."""
    if device_type != "cuda" or not cuda_indices:
        return None
    return nvml_reader(cuda_indices)

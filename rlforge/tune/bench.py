"""Measured peak rates of the visible GPU: one bf16 GEMM and one device copy, measured once per device and
cached in ``~/.cache/rlforge/device-<name>.json`` (``RLFORGE_CACHE`` overrides the folder).

:func:`measured_device` returns ``spec`` with ``flops`` and ``bandwidth`` replaced by the cached (or
freshly measured) rates; ``rlforge tune --probe`` calls it before planning.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rlforge.tune.device import DeviceSpec


def cache_file(name: str) -> Path:
    """The cache file of device ``name``."""
    folder = Path(os.environ.get("RLFORGE_CACHE", "~/.cache/rlforge")).expanduser()
    return folder / f"device-{re.sub(r'[^A-Za-z0-9]+', '-', name).strip('-')}.json"


def measure_cuda(n: int = 8192, copy_bytes: int = 1 << 30, reps: int = 10) -> tuple[float, float]:
    """(FLOP/s of an ``n x n x n`` bf16 GEMM, bytes/s of a ``copy_bytes`` device copy counted as read +
    write), best of ``reps`` after a warm-up, timed by CUDA events."""
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    src = torch.empty(copy_bytes, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)

    def best(fn: Callable[[], object]) -> float:
        fn()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return min(times)

    gemm_s = best(lambda: a @ b)
    copy_s = best(lambda: dst.copy_(src))
    return 2.0 * n**3 / gemm_s, 2.0 * copy_bytes / copy_s


def measured_device(spec: DeviceSpec, measure: Callable[[], tuple[float, float]] = measure_cuda) -> DeviceSpec:
    """``spec`` at the cached rates, measuring (and caching) them first when there is no cache file."""
    if spec.is_cpu:
        return spec
    path = cache_file(spec.name)
    if path.is_file():
        data = json.loads(path.read_text())
    else:
        flops, bandwidth = measure()
        data = {"name": spec.name, "flops": flops, "bandwidth": bandwidth}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
    return replace(spec, flops=float(data["flops"]), bandwidth=float(data["bandwidth"]), measured=True)

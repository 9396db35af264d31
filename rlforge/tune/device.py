"""The device the tuner plans for: memory, peak rates, host link.

Spec numbers (dense bf16, HBM bandwidth) are the vendors' datasheets; ``memory_bytes`` is what
``torch.cuda.get_device_properties().total_memory`` reports for the card (H100 SXM 80 GB: 79.2 GiB;
H200: 139.8 GiB).  :func:`detect` reads the real device through NVML (no CUDA context is created, so
the launching process may call it) or torch; a cached micro-benchmark (:mod:`rlforge.tune.bench`)
replaces the datasheet rates by measured ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

GiB = float(2**30)


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator.

    Attributes:
        name: e.g. ``"NVIDIA H200"`` or ``"cpu"``.
        memory_bytes: device memory (bytes).
        flops: dense bf16 FLOP/s reachable by a large GEMM.
        bandwidth: device-memory bytes/s reachable by a large copy (read + write counted once each).
        host_link: host<->device bytes/s (PCIe), for offload.
        peer_link: device<->device bytes/s (NVLink), for collectives.
        measured: whether ``flops``/``bandwidth`` come from the micro-benchmark.
    """

    name: str
    memory_bytes: float
    flops: float
    bandwidth: float
    host_link: float = 25e9
    peer_link: float = 200e9
    measured: bool = False

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"


# Datasheet numbers at the efficiency a well-fed kernel gets (GEMM ~70% of 989 TF, copies ~85% of HBM).
SPECS: dict[str, DeviceSpec] = {
    "H200": DeviceSpec("NVIDIA H200", 139.8 * GiB, 0.70 * 989e12, 0.85 * 4.8e12, 50e9, 400e9),
    "H100": DeviceSpec("NVIDIA H100 80GB HBM3", 79.2 * GiB, 0.70 * 989e12, 0.85 * 3.35e12, 50e9, 400e9),
    "A100": DeviceSpec("NVIDIA A100-SXM4-80GB", 79.2 * GiB, 0.70 * 312e12, 0.85 * 2.0e12, 25e9, 250e9),
    "cpu": DeviceSpec("cpu", 16 * GiB, 1e11, 1e10, 1e10, 1e10),
}


def spec_for_name(name: str, memory_bytes: float | None = None) -> DeviceSpec:
    """The table's entry whose key appears in ``name`` (``"NVIDIA H200"`` -> H200), with the real
    memory size when given; an unknown GPU gets H100 rates and its own memory."""
    base = next((s for k, s in SPECS.items() if k != "cpu" and k in name), SPECS["H100"])
    return replace(base, name=name, memory_bytes=memory_bytes or base.memory_bytes)


def fake_device(memory_gb: float, name: str = "fake", tflops: float = 700.0, bandwidth_tbs: float = 2.8,
                host_link_gbs: float = 50.0) -> DeviceSpec:
    """A device for tests and ``rlforge tune --device-memory-gb``: ``memory_gb`` in 1e9 bytes."""
    return DeviceSpec(name, memory_gb * 1e9, tflops * 1e12, bandwidth_tbs * 1e12, host_link_gbs * 1e9, 400e9)


def detect() -> DeviceSpec:
    """The visible device: the first GPU (NVML, else torch), else :data:`SPECS` ``["cpu"]``."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            if pynvml.nvmlDeviceGetCount() > 0:
                handle = pynvml.nvmlDeviceGetHandleByIndex(0)
                name = pynvml.nvmlDeviceGetName(handle)
                name = name.decode() if isinstance(name, bytes) else str(name)
                return spec_for_name(name, float(pynvml.nvmlDeviceGetMemoryInfo(handle).total))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library / driver: ask torch
        pass
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return spec_for_name(props.name, float(props.total_memory))
    return SPECS["cpu"]

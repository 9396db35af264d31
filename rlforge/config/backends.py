"""Values of verl keys that name hardware or a backend rlforge cannot have: one refusal line each.

verl runs on Ascend NPUs (``trainer.device=npu``).  rlforge runs on CUDA GPUs or the CPU; a run
that asks for another device stops before anything loads, with a line naming the key, the value, and
what rlforge needs.  (Rollout backends are not refused: verl's ``vllm``, ``sglang`` and ``trtllm`` run
as rlforge's ``native`` engine with a warning, :mod:`rlforge.config.later_work`.)
"""

from __future__ import annotations

from typing import Any

from rlforge.errors import ConfigError

DEVICES_NOT_HERE: dict[str, str] = {
    "npu": "Ascend NPUs (torch_npu)",
    "xpu": "Intel XPUs",
    "mps": "Apple MPS",
}
"""``trainer.device`` values verl (or torch) knows that rlforge does not run on: {value: what it is}."""

def check_backends(cfg: Any) -> None:
    """Refuse a ``trainer.device`` of :data:`DEVICES_NOT_HERE`.

    Raises:
        ConfigError: one line naming the key, the value and what rlforge runs on.
    """
    device = str(cfg.trainer.device)
    kind = device.split(":")[0]
    if kind in DEVICES_NOT_HERE:
        raise ConfigError(f"trainer.device={device}: {DEVICES_NOT_HERE[kind]} are not supported; rlforge runs on "
                          "NVIDIA CUDA GPUs or the CPU (set trainer.device=cuda, cpu or auto)")

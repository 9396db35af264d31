"""Values of verl keys that name hardware or a backend rlforge cannot have: one refusal line each.

verl runs on Ascend NPUs (``trainer.device=npu``) and with a TensorRT-LLM rollout
(``actor_rollout_ref.rollout.name=trtllm``).  rlforge runs on CUDA GPUs or the CPU, and generates
with its own engine (``native``; verl's ``vllm`` and ``sglang`` run as ``native`` with a warning,
:mod:`rlforge.config.later_work`) or transformers' ``generate`` (``hf``).  A run that asks for
something else stops before anything loads, with a line naming the key, the value, and what rlforge
does instead or needs.
"""

from __future__ import annotations

from typing import Any

from rlforge.errors import ConfigError

_ARR = "actor_rollout_ref"

DEVICES_NOT_HERE: dict[str, str] = {
    "npu": "Ascend NPUs (torch_npu)",
    "xpu": "Intel XPUs",
    "mps": "Apple MPS",
}
"""``trainer.device`` values verl (or torch) knows that rlforge does not run on: {value: what it is}."""

ROLLOUTS_NOT_HERE: dict[str, str] = {
    "trtllm": "TensorRT-LLM",
}
"""``rollout.name`` values of verl that rlforge has no engine for: {value: what it is}."""


def check_backends(cfg: Any) -> None:
    """Refuse a ``trainer.device`` or ``rollout.name`` of :data:`DEVICES_NOT_HERE` / :data:`ROLLOUTS_NOT_HERE`.

    Raises:
        ConfigError: one line naming the key, the value and what rlforge runs instead.
    """
    device = str(cfg.trainer.device)
    kind = device.split(":")[0]
    if kind in DEVICES_NOT_HERE:
        raise ConfigError(f"trainer.device={device}: {DEVICES_NOT_HERE[kind]} are not supported; rlforge runs on "
                          "NVIDIA CUDA GPUs or the CPU (set trainer.device=cuda, cpu or auto)")
    name = str(cfg.actor_rollout_ref.rollout.name)
    if name in ROLLOUTS_NOT_HERE:
        raise ConfigError(f"{_ARR}.rollout.name={name}: a {ROLLOUTS_NOT_HERE[name]} rollout is not available in "
                          "rlforge; set rollout.name=native (rlforge's engine, which also runs verl's vllm and "
                          "sglang settings) or hf (transformers' generate)")

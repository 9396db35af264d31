"""The rollout's tensor-parallel size a run uses (torch-free: validation and the tuner ask it too).

verl's ``rollout.tensor_model_parallel_size`` defaults to 2 and its example scripts set it for vLLM and
SGLang.  rlforge runs those names on its native engine, which is tensor parallel too
(:mod:`rlforge.rollout.native.tensor_parallel`).  The size a run uses:

- not set by the user: 1 (verl's default of 2 is nobody's choice, and a single-GPU run must not fail on it);
- ``rollout.name=native``: the size the user set (the engine refuses one that does not divide the world or
  the heads, one line);
- ``vllm`` / ``sglang`` / ``trtllm``: the size the user set where it divides the world, else 1 with a
  warning (:mod:`rlforge.config.later_work`), so that a verl script runs on fewer GPUs than it names;
- ``hf``: 1 (transformers' ``generate`` is one model copy).
"""

from __future__ import annotations

from typing import Any

from rlforge.config.user_keys import user_set

KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"
VERL_NAMES = ("vllm", "sglang", "trtllm")


def rollout_tp_size(cfg: Any, world: int) -> int:
    """The tensor-parallel size of ``cfg``'s rollout on ``world`` processes (module doc)."""
    r = cfg.actor_rollout_ref.rollout
    size = int(r.tensor_model_parallel_size)
    if size <= 1 or r.name == "hf" or not user_set(cfg, KEY):
        return 1
    if r.name == "native":
        return size
    return size if r.name in VERL_NAMES and world % size == 0 else 1


def honoured(cfg: Any) -> bool:
    """Whether a size above 1 is used as given, on the run's world (:func:`rlforge.config.world.run_world`)."""
    from rlforge.config.world import run_world
    from rlforge.errors import ConfigError

    try:
        world = run_world(cfg).size
    except ConfigError:  # validation names the world's own error
        return False
    size = int(cfg.actor_rollout_ref.rollout.tensor_model_parallel_size)
    return size <= 1 or rollout_tp_size(cfg, world) == size

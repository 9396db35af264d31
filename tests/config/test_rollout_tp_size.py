"""The rollout's tensor-parallel size a run uses (rlforge.config.rollout_tp), by hand."""

from __future__ import annotations

import pytest

from rlforge.config import load_config
from rlforge.config.rollout_tp import rollout_tp_size

K = "actor_rollout_ref.rollout.tensor_model_parallel_size"
N = "actor_rollout_ref.rollout.name"


@pytest.mark.parametrize(("overrides", "world", "expected"), [
    ([f"{N}=vllm"], 8, 1),                 # verl's default of 2: not the user's
    ([f"{N}=native"], 8, 1),
    ([f"{N}=vllm", f"{K}=4"], 8, 4),       # a verl script's size, honoured where it divides the world
    ([f"{N}=sglang", f"{K}=4"], 2, 1),     # ... and not where it does not (a warning says so)
    ([f"{N}=vllm", f"{K}=2"], 1, 1),       # the same script on one GPU
    ([f"{N}=native", f"{K}=2"], 1, 2),     # native: the user's size (the engine refuses it on one process)
    ([f"{N}=hf", f"{K}=2"], 2, 1),
    ([f"{N}=native", f"{K}=1"], 4, 1),
])
def test_rollout_tp_size(overrides, world, expected):
    assert rollout_tp_size(load_config(overrides), world) == expected


def test_the_warning_names_a_size_that_is_not_used():
    from rlforge.config import validate_config

    warned = validate_config(load_config([f"{N}=vllm", f"{K}=4"]))  # world 1: not used
    assert any(w.startswith(f"{K}=4: runs as 1") for w in warned), warned
    warned = validate_config(load_config([f"{N}=vllm", f"{K}=2", "trainer.n_gpus_per_node=2"]))
    assert not any(w.startswith(f"{K}=") for w in warned), warned


def test_native_with_a_size_that_does_not_divide_the_processes_is_one_line():
    from rlforge.config import validate_config
    from rlforge.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^{K}=2 does not divide the 1 process\(es\) of this run"):
        validate_config(load_config([f"{N}=native", f"{K}=2"]))
    validate_config(load_config([f"{N}=native", f"{K}=2", "trainer.n_gpus_per_node=2"]))

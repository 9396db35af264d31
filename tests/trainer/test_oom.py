"""A CUDA out-of-memory error in a trainer stage becomes one message naming the stage, the
memory and the keys to change; other errors pass through unchanged (CPU: the error is raised
by a stand-in stage, with a fake memory reading)."""

from __future__ import annotations

import pytest
import torch
from helpers import FAST, SMALL

from rlforge.config import load_config
from rlforge.errors import DeviceOutOfMemory, RLForgeError
from rlforge.trainer.oom import STAGE_KEYS, MemoryReading, oom_guard

GIB = 2**30
MEMORY = MemoryReading(allocated=int(70.25 * GIB), reserved=int(72.5 * GIB), total=int(79.5 * GIB), device="cuda:0")
TORCH_TEXT = "CUDA out of memory. Tried to allocate 2.50 GiB. GPU 0 has a total capacity of 79.50 GiB"


def raise_in(stage: str, cfg, error: BaseException, offload_works: bool = True,
             memory: MemoryReading | None = MEMORY) -> BaseException:
    """The exception that leaves ``oom_guard(stage)`` when the stage raises ``error``."""
    with pytest.raises(BaseException) as info:
        with oom_guard(stage, cfg, offload_works, read_memory=lambda: memory):
            raise error
    return info.value


def test_torch_oom_names_stage_memory_and_update_keys():
    cfg = load_config(["actor_rollout_ref.actor.use_dynamic_bsz=true",
                       "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
                       "actor_rollout_ref.model.enable_gradient_checkpointing=false"])
    original = torch.cuda.OutOfMemoryError(TORCH_TEXT)  # constructible without a GPU
    err = raise_in("update_actor", cfg, original)
    assert isinstance(err, DeviceOutOfMemory) and isinstance(err, RLForgeError)
    assert err.__cause__ is original
    msg = str(err)
    assert "\n" not in msg
    for part in ("stage update_actor", "tried to allocate 2.50 GiB", "70.2 GiB allocated", "72.5 GiB reserved",
                 "of 79.5 GiB on cuda:0",
                 "lower actor_rollout_ref.actor.ppo_max_token_len_per_gpu (now 16384)",
                 "set actor_rollout_ref.model.enable_gradient_checkpointing=true",
                 "set actor_rollout_ref.actor.fsdp_config.param_offload=true",
                 "set actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"):
        assert part in msg, (part, msg)
    assert "ppo_micro_batch_size_per_gpu" not in msg  # dynamic batching: the token budget is the knob
    assert "gpu_memory_utilization" not in msg


def test_fixed_micro_batches_name_the_micro_batch_size_and_skip_keys_already_on():
    cfg = load_config(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                       "actor_rollout_ref.actor.fsdp_config.param_offload=true"])
    msg = str(raise_in("update_actor", cfg, RuntimeError("CUDA error: out of memory")))
    assert "lower actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu (now 8)" in msg
    assert "ppo_max_token_len_per_gpu" not in msg
    assert "param_offload" not in msg  # already on
    assert "enable_gradient_checkpointing" not in msg  # on by default


def test_forward_only_stages_name_their_log_prob_keys():
    cfg = load_config(["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
                       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=6"])
    old = str(raise_in("old_log_prob", cfg, torch.OutOfMemoryError(TORCH_TEXT)))
    assert "lower actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu (now 4)" in old
    assert "enable_gradient_checkpointing" not in old  # no backward in a forward-only stage
    ref = str(raise_in("ref", cfg, torch.OutOfMemoryError(TORCH_TEXT)))
    assert "lower actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu (now 6)" in ref
    assert "set actor_rollout_ref.ref.fsdp_config.param_offload=true" in ref


def test_generation_names_the_rollout_memory_keys():
    native = load_config(["actor_rollout_ref.rollout.name=native"])
    msg = str(raise_in("gen", native, torch.OutOfMemoryError(TORCH_TEXT)))
    assert "stage gen" in msg
    assert "lower actor_rollout_ref.rollout.gpu_memory_utilization (now 0.5)" in msg
    assert "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true" in msg
    hf = str(raise_in("gen", load_config(["actor_rollout_ref.rollout.name=hf"]), torch.OutOfMemoryError(TORCH_TEXT)))
    assert "gpu_memory_utilization" not in hf and "lower data.train_batch_size" in hf


def test_megatron_names_its_own_offload_keys():
    cfg = load_config(["actor_rollout_ref.actor.strategy=megatron"])
    msg = str(raise_in("update_actor", cfg, torch.OutOfMemoryError(TORCH_TEXT)))
    assert "set actor_rollout_ref.actor.megatron.param_offload=true" in msg
    assert "fsdp_config" not in msg


def test_critic_stages_name_the_critic_keys():
    cfg = load_config(["algorithm.adv_estimator=gae", "critic.use_dynamic_bsz=true"])
    msg = str(raise_in("update_critic", cfg, torch.OutOfMemoryError(TORCH_TEXT)))
    assert "lower critic.ppo_max_token_len_per_gpu" in msg
    assert "set critic.model.fsdp_config.param_offload=true" in msg
    values = str(raise_in("values", cfg, torch.OutOfMemoryError(TORCH_TEXT)))
    assert "lower critic.forward_max_token_len_per_gpu" in values


def test_the_local_engine_says_offload_needs_a_sharded_engine():
    msg = str(raise_in("update_actor", load_config([]), torch.OutOfMemoryError(TORCH_TEXT), offload_works=False))
    assert "set actor_rollout_ref.actor.fsdp_config.param_offload" not in msg
    assert "actor_rollout_ref.actor.fsdp_config.param_offload=true" in msg and "sharded engine" in msg


def test_no_reading_and_an_unlisted_stage():
    msg = str(raise_in("adv", load_config([]), torch.OutOfMemoryError("CUDA out of memory."), memory=None))
    assert "stage adv" in msg and "no CUDA memory reading" in msg
    assert "adv" not in STAGE_KEYS


def test_fragmentation_hint():
    frag = MemoryReading(allocated=40 * GIB, reserved=70 * GIB, total=80 * GIB, device="cuda:1")
    msg = str(raise_in("update_actor", load_config([]), torch.OutOfMemoryError(TORCH_TEXT), memory=frag))
    assert "30.0 GiB are reserved but not allocated" in msg and "expandable_segments:True" in msg
    assert "expandable_segments" not in str(raise_in("update_actor", load_config([]),
                                                     torch.OutOfMemoryError(TORCH_TEXT)))


@pytest.mark.parametrize("error", [RuntimeError("size mismatch between tensors"), ValueError("out of memory"),
                                   KeyError("x")])
def test_other_errors_pass_through_unchanged(error):
    assert raise_in("update_actor", load_config([]), error) is error


@pytest.mark.e2e
def test_the_cli_prints_one_line_and_exits_2(tmp_path, monkeypatch, capsys):
    """Through the real trainer: the actor update raises CUDA OOM; ``rlforge train`` prints one
    ``rlforge: error:`` line naming the stage and exits with status 2, no traceback."""
    from rlforge.cli import main
    from rlforge.roles.actor import Actor

    def oom(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError(TORCH_TEXT)

    monkeypatch.setattr(Actor, "update", oom)
    rc = main(["train", *SMALL, *FAST, f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=1"])
    err = capsys.readouterr().err
    assert rc == 2
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("rlforge: error: ")]
    assert len(lines) == 1, err
    assert "out of memory in stage update_actor" in lines[0]
    assert "no CUDA memory reading" in lines[0]  # CPU run
    # one process runs the sharded engine on a one-device mesh: its offload keys take effect
    assert "set actor_rollout_ref.actor.fsdp_config.param_offload=true" in lines[0]
    assert "sharded engine" not in lines[0]

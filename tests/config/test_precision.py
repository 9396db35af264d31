"""Offload / dtype / strategy combinations that cannot work get one ConfigError naming the keys
and the fix (rlforge.config.precision); the ones that work are accepted."""

from __future__ import annotations

import pytest

from rlforge.config import load_config, validate_config
from rlforge.errors import ConfigError

A = "actor_rollout_ref.actor"
MEGATRON = [f"{A}.strategy=megatron", "trainer.n_gpus_per_node=2"]


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        ([*MEGATRON, f"{A}.fsdp_config.param_offload=true"],
         [f"{A}.fsdp_config.param_offload=true has no effect with {A}.strategy=megatron",
          f"set {A}.megatron.param_offload=true"]),
        ([*MEGATRON, f"{A}.fsdp_config.optimizer_offload=true"], [f"set {A}.megatron.optimizer_offload=true"]),
        ([*MEGATRON, f"{A}.fsdp_config.offload_policy=true"], [f"set {A}.megatron.param_offload=true"]),
        ([*MEGATRON, f"{A}.fsdp_config.model_dtype=bf16"],
         [f"{A}.fsdp_config.model_dtype=bf16 have no effect with {A}.strategy=megatron", f"{A}.megatron.dtype"]),
        ([*MEGATRON, f"+{A}.fsdp_config.mixed_precision.param_dtype=bf16"], [f"{A}.fsdp_config.mixed_precision="]),
        ([*MEGATRON, "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.fsdp_config.param_offload=true"],
         ["actor_rollout_ref.ref.fsdp_config.param_offload=true has no effect",
          "set actor_rollout_ref.ref.megatron.param_offload=true"]),
        ([f"{A}.fsdp_config.model_dtype=fp16"],
         [f"{A}.fsdp_config.model_dtype=fp16", "grad scaler", f"{A}.fsdp_config.model_dtype=fp32"]),
        ([f"+{A}.fsdp_config.mixed_precision.param_dtype=fp16"],
         [f"{A}.fsdp_config.mixed_precision.param_dtype=fp16", "loss scaling",
          f"Set {A}.fsdp_config.mixed_precision.param_dtype=bf16"]),
        ([f"+{A}.fsdp_config.mixed_precision.reduce_dtype=float16"],
         [f"Set {A}.fsdp_config.mixed_precision.reduce_dtype=fp32"]),
        ([*MEGATRON, f"{A}.megatron.dtype=float16"], [f"{A}.megatron.dtype=float16", f"{A}.megatron.dtype=bfloat16"]),
        (["algorithm.adv_estimator=gae", "+critic.model.fsdp_config.mixed_precision.param_dtype=fp16"],
         ["critic.model.fsdp_config.mixed_precision.param_dtype=fp16"]),
        ([f"+{A}.fsdp_config.mixed_precision.params_dtype=bf16"],
         [f"{A}.fsdp_config.mixed_precision.params_dtype: unknown key", "param_dtype, reduce_dtype, buffer_dtype"]),
        ([f"{A}.fsdp_config.model_dtype=half"], [f"{A}.fsdp_config.model_dtype='half': expected one of"]),
        # FSDP1's CPU offload keeps only the last micro-batch's gradient
        ([f"{A}.strategy=fsdp", f"{A}.fsdp_config.offload_policy=true", f"{A}.ppo_micro_batch_size_per_gpu=8"],
         [f"{A}.fsdp_config.offload_policy=true with {A}.strategy=fsdp", "keeps only the last micro-batch's gradient",
          f"{A}.ppo_micro_batch_size_per_gpu=8 splits each rank's mini-batch of 256 sequences into 32",
          f"Set {A}.strategy=fsdp2", f"{A}.fsdp_config.param_offload=true (parameters on the CPU between phases"]),
        ([f"{A}.strategy=fsdp", f"{A}.fsdp_config.offload_policy=true", f"{A}.use_dynamic_bsz=true"],
         [f"{A}.fsdp_config.offload_policy=true with {A}.strategy=fsdp", f"{A}.use_dynamic_bsz=true packs"]),
        (["algorithm.adv_estimator=gae", "critic.strategy=fsdp", "critic.model.fsdp_config.offload_policy=true",
          "critic.ppo_micro_batch_size_per_gpu=4"],
         ["critic.model.fsdp_config.offload_policy=true with critic.strategy=fsdp", "the critic would silently"]),
    ],
)
def test_refused(overrides, needles):
    with pytest.raises(ConfigError) as info:
        validate_config(load_config(overrides))
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


@pytest.mark.parametrize(
    "overrides",
    [
        [*MEGATRON, f"{A}.megatron.param_offload=true", f"{A}.megatron.optimizer_offload=true"],
        [f"{A}.strategy=fsdp2", f"{A}.fsdp_config.param_offload=true", f"{A}.fsdp_config.optimizer_offload=true"],
        [f"{A}.fsdp_config.model_dtype=bf16", f"{A}.fsdp_config.optimizer_offload=true", f"{A}.optim.lr=1e-3"],
        ["trainer.device=cpu", f"+{A}.fsdp_config.mixed_precision.param_dtype=bf16"],
        # the reference only runs forwards: fp16 is fine there (and an unused ref is not checked)
        ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.fsdp_config.model_dtype=fp16"],
        [*MEGATRON, "actor_rollout_ref.ref.fsdp_config.param_offload=true"],
        # the critic's blocks matter only when a critic is trained
        ["algorithm.adv_estimator=grpo", "+critic.model.fsdp_config.mixed_precision.param_dtype=fp16"],
        # FSDP1 offload with one micro-batch per optimizer step, or in the reference, is correct
        [f"{A}.strategy=fsdp", f"{A}.fsdp_config.offload_policy=true"],
        # param_offload is verl's phase offload: gradient accumulation is as without it (FSDP1 and FSDP2)
        [f"{A}.strategy=fsdp", f"{A}.fsdp_config.param_offload=true", f"{A}.ppo_micro_batch_size_per_gpu=8"],
        ["algorithm.adv_estimator=gae", "critic.strategy=fsdp", "critic.model.fsdp_config.param_offload=true",
         "critic.ppo_micro_batch_size_per_gpu=4", "trainer.device=cuda"],
        [f"{A}.strategy=fsdp", f"{A}.ppo_micro_batch_size_per_gpu=8", f"{A}.use_kl_loss=true",
         "actor_rollout_ref.ref.fsdp_config.param_offload=true"],
        # FSDP2's CPUOffloadPolicy accumulates correctly; optimizer offload on CPU is a no-op
        [f"{A}.strategy=fsdp2", f"{A}.fsdp_config.offload_policy=true", f"{A}.use_dynamic_bsz=true"],
        ["trainer.device=cpu", f"{A}.fsdp_config.optimizer_offload=true"],
    ],
)
def test_accepted(overrides):
    validate_config(load_config(overrides))  # no ConfigError


def test_offload_policy_with_fsdp1_is_applied_with_a_warning():
    warnings = validate_config(load_config(["trainer.device=cuda", f"{A}.strategy=fsdp", f"{A}.fsdp_config.offload_policy=true"]))
    assert any(w.startswith(f"{A}.fsdp_config.offload_policy=true with {A}.strategy=fsdp") and "CPUOffload" in w
               for w in warnings), warnings
    assert not any("offload_policy" in w for w in validate_config(
        load_config(["trainer.device=cuda", f"{A}.strategy=fsdp2", f"{A}.fsdp_config.offload_policy=true"])))


def test_bf16_master_weights_at_a_small_lr_warn():
    warnings = validate_config(load_config([f"{A}.fsdp_config.model_dtype=bf16", f"{A}.optim.lr=1e-6"]))
    assert any(w.startswith(f"{A}.fsdp_config.model_dtype=bf16") and "lr=1e-06" in w for w in warnings), warnings


REF = "actor_rollout_ref.ref.fsdp_config"


@pytest.mark.parametrize(("device", "cuda"), [("cpu", True), ("auto", False)])
def test_offload_on_a_cpu_run_is_one_warning(monkeypatch, device, cuda):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    for strategy in ("fsdp", "fsdp2"):
        warnings = validate_config(load_config([
            f"trainer.device={device}", f"{A}.strategy={strategy}", f"{A}.fsdp_config.param_offload=true",
            f"{A}.fsdp_config.offload_policy=true", f"{A}.use_kl_loss=true", f"{REF}.param_offload=true",
            f"{A}.fsdp_config.optimizer_offload=true",
        ]))
        offload = [w for w in warnings if "offload" in w]
        assert len(offload) == 1, offload
        for key in (f"{A}.fsdp_config.param_offload=true", f"{A}.fsdp_config.offload_policy=true",
                    f"{REF}.param_offload=true"):
            assert key in offload[0]
        assert "optimizer_offload" not in offload[0]  # a no-op on CPU, not worth a line
        assert "CPU run" in offload[0] and "running without offload" in offload[0]


def test_offload_on_a_gpu_run_does_not_warn(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    warnings = validate_config(load_config([f"{A}.strategy=fsdp2", f"{A}.fsdp_config.param_offload=true"]))
    assert not any("offload" in w for w in warnings), warnings


def test_megatron_param_offload_on_a_cpu_run_is_the_same_warning():
    warnings = validate_config(load_config(["trainer.device=cpu", *MEGATRON, f"{A}.megatron.param_offload=true"]))
    offload = [w for w in warnings if "offload" in w]
    assert len(offload) == 1 and f"{A}.megatron.param_offload=true on a CPU run" in offload[0], offload

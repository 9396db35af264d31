"""Every advantage estimator and every policy loss trains one step on a GPU (CUDA only; skipped
without a GPU).

The jobs are those of ``tests/trainer/test_algorithm_suite_runs.py`` (``preset:tiny``,
``builtin:distribution``, one step) with ``trainer.device=cuda``: the default job's engine,
``strategy=fsdp2`` with bf16 mixed precision (float32 master weights, bf16 compute), as a GPU
run gets it.  The registries are iterated, so a new estimator or loss is covered without
editing this file.  Each job must log a finite loss and gradient norm, and its exported policy
must differ from the initial weights (and hold only finite values).  FlowRL failed here once
("mat1 and mat2 must have the same dtype", the float32 log Z head under bf16 FSDP2).

``test_the_check_runs_on_cpu`` runs the same check once on the CPU, so the test code itself is
exercised where there is no GPU (the CPU suite runs every algorithm already).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from trainer.test_algorithm_suite_runs import needed_overrides, one_step

from rlforge.algorithms import ADV_ESTIMATORS, POLICY_LOSSES

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
SEED = 1  # data.seed: the seed the job initialises preset:tiny with


def _initial_weights(hf: Path) -> dict[str, torch.Tensor]:
    from rlforge.models import load_causal_lm, load_tokenizer

    return load_causal_lm("preset:tiny", load_tokenizer(str(hf)), seed=SEED).state_dict()


def train_one_step(tmp: Path, device: str, *extra: str) -> dict:
    """One RL step on ``device``; checks the logged loss and the exported weights; returns the metrics."""
    from rlforge.models import load_causal_lm, load_tokenizer

    row = one_step(tmp, f"trainer.device={device}", f"data.seed={SEED}", *extra)
    assert math.isfinite(row["actor/pg_loss"]) and math.isfinite(row["actor/grad_norm"]), row
    assert row["actor/grad_norm"] > 0, row
    hf = tmp / "global_step_1" / "actor" / "huggingface"
    trained = load_causal_lm(str(hf), load_tokenizer(str(hf))).state_dict()
    initial = _initial_weights(hf)
    assert set(trained) == set(initial)
    changed = []
    for name, value in trained.items():
        assert torch.isfinite(value).all(), name
        if not torch.equal(value, initial[name].to(value.dtype)):
            changed.append(name)
    assert changed, "no weight changed in one optimizer step"
    return row


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", ADV_ESTIMATORS.names())
def test_every_advantage_estimator_trains_on_gpu(tmp_path, name):
    train_one_step(tmp_path, "cuda", f"algorithm.adv_estimator={name}", *needed_overrides(tmp_path, name))


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_policy_loss_trains_on_gpu(tmp_path, name):
    train_one_step(tmp_path, "cuda", f"actor_rollout_ref.actor.policy_loss.loss_mode={name}",
                   *needed_overrides(tmp_path, name))


@pytest.mark.e2e
def test_the_check_runs_on_cpu(tmp_path):
    row = train_one_step(tmp_path, "cpu", "actor_rollout_ref.actor.policy_loss.loss_mode=flowrl")
    assert "actor/flowrl/log_z_mean" in row

"""``torchrun ... -m rlforge.trainer.main_ppo``: the world size is the launcher's (CPU, gloo).

A TP=2 x PP=2 megatron job runs on 4 torchrun processes without ``trainer.n_gpus_per_node``,
and its checkpoint exports to a Hugging Face folder; an explicit ``trainer.n_gpus_per_node`` that
disagrees with the launcher is one ``rlforge: error:`` line, printed once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlforge.trainer.dcp_io import saved_model_state

pytestmark = pytest.mark.e2e

TOK = os.environ.get("RLFORGE_TEST_TOKENIZER") or None
TINY = ["data.train_files=builtin:arithmetic", "data.val_files=null", "actor_rollout_ref.model.path=preset:tiny",
        *([f"actor_rollout_ref.model.tokenizer_path={TOK}"] if TOK else []), "trainer.device=cpu"]


def torchrun(nproc: int, *args: str, timeout: float) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node NPROC -m rlforge.trainer.main_ppo ARGS`` (a free port)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "rlforge.trainer.main_ppo", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


@pytest.mark.slow
def test_torchrun_megatron_takes_the_launchers_world_size_and_exports(tmp_path):
    meg = "actor_rollout_ref.actor.megatron"
    res = torchrun(4, *TINY, "actor_rollout_ref.actor.strategy=megatron", f"{meg}.tensor_model_parallel_size=2",
                   f"{meg}.pipeline_model_parallel_size=2", "trainer.total_training_steps=1",
                   "algorithm.adv_estimator=grpo", "data.train_batch_size=4", "data.builtin.train_size=8",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=2",
                   "data.max_response_length=4", "trainer.val_before_train=false", "trainer.logger=[file]",
                   "trainer.save_freq=1", f"trainer.default_local_dir={tmp_path / 'run'}", timeout=540)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "rlforge: error" not in res.stderr
    (row,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert (row["parallel/tp"], row["parallel/pp"], row["parallel/dp"]) == (2.0, 2.0, 1.0)

    # the megatron checkpoint (plain HF-keyed state) exports like any other
    from transformers import AutoModelForCausalLM

    from rlforge.cli import main

    assert main(["export", str(tmp_path / "run"), "--out", str(tmp_path / "hf")]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").state_dict()
    state = saved_model_state(tmp_path / "run" / "global_step_1")
    for k, v in state.items():
        torch.testing.assert_close(exported[k], v, atol=0, rtol=0)


@pytest.mark.slow  # ~20-30 s: two processes start torch and transformers on 2 busy cores
def test_torchrun_with_a_disagreeing_n_gpus_per_node_prints_one_error(tmp_path):
    res = torchrun(2, *TINY, "trainer.n_gpus_per_node=3", f"trainer.default_local_dir={tmp_path}", timeout=300)
    assert res.returncode != 0  # torchrun exits 1 and names rank 0's exit status 2
    errors = [line for line in res.stderr.splitlines() if line.startswith("rlforge: error: ")]
    assert len(errors) == 1, res.stderr[-4000:]
    assert "= 1 x 3 = 3" in errors[0] and "WORLD_SIZE=2" in errors[0] and "trainer.n_gpus_per_node=2" in errors[0]
    assert "exitcode  : 2" in res.stderr  # torchrun's summary: rank 0 exited with the user-error status
    assert "rlforge/" not in res.stderr.split("rlforge: error: ")[0]  # no rlforge traceback before the line
    assert not Path(tmp_path / "metrics.jsonl").exists()

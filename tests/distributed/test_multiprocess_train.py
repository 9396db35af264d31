"""``rlforge train trainer.n_gpus_per_node=2`` on CPU: two gloo processes through torchrun.

Each strategy (FSDP2, FSDP1) trains two steps and saves a checkpoint; a single-process run
then resumes from it, which checks that the sharded engines write full, plain state dicts.
The FSDP2 run (``old_log_prob`` taken from the update's forward) is also the on-policy test's
reference for a run that recomputes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

COMMON = [
    "actor_rollout_ref.model.path=preset:tiny",
    "actor_rollout_ref.model.tokenizer_path=builtin:integers",
    "trainer.device=cpu",
    "data.train_files=builtin:distribution",
    "data.val_files=null",
    "data.max_prompt_length=16",
    "data.max_response_length=1",
    "data.train_batch_size=4",
    "data.builtin.train_size=16",
    "actor_rollout_ref.rollout.n=4",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "trainer.val_before_train=false",
    "trainer.logger=[file]",
    # the default job saves only the policy's Hugging Face folder; these runs save checkpoints to resume from
    "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]",
]


def rlforge(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    return subprocess.run([sys.executable, "-m", "rlforge.cli", "train", *COMMON, *args],
                          capture_output=True, text=True, env=env, timeout=300)


def failure(res: subprocess.CompletedProcess) -> str:
    """A failed run's stderr for an assertion message: every rank's error lines first (the first
    rank to fail is the cause, the others' errors are its consequence), then the tail."""
    errors = [ln for ln in res.stderr.splitlines() if "Error" in ln or "error:" in ln or "exitcode" in ln]
    return "\n".join(errors[:40]) + "\n--- stderr tail ---\n" + res.stderr[-3000:]


def two_process_run(out, strategy: str, *extra: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Two steps on two processes with ``strategy``, a checkpoint at step 2; the result and the rows."""
    res = rlforge("trainer.n_gpus_per_node=2", f"actor_rollout_ref.actor.strategy={strategy}",
                  "trainer.total_training_steps=2", "trainer.save_freq=2", f"trainer.default_local_dir={out}", *extra)
    assert res.returncode == 0, failure(res)
    return res, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def fsdp2_run(tmp_path_factory):
    """:func:`two_process_run` with FSDP2 and the default ``recompute_old_log_prob`` (null: here
    ppo_mini_batch_size = train_batch_size, so ``old_log_prob`` comes from the update's forward),
    made once for the resume test and the on-policy test (3 interpreter starts and a run saved)."""
    out = tmp_path_factory.mktemp("fsdp2_run")
    return out, *two_process_run(out, "fsdp2")


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_two_process_training_then_single_process_resume(request, tmp_path, strategy):
    if strategy == "fsdp2":
        tmp_path, res, rows = request.getfixturevalue("fsdp2_run")
    else:
        res, rows = two_process_run(tmp_path, strategy)
    assert [r["step"] for r in rows] == [1, 2]  # rank 0 logs, once per step
    assert all(r["actor/grad_norm"] > 0 for r in rows)  # continuous rewards: the policy moves
    assert (tmp_path / "global_step_2" / "actor" / ".metadata").exists()  # sharded: each rank wrote its shards
    assert sorted(p.name for p in (tmp_path / "global_step_2" / "actor").glob("*.distcp")) == ["__0_0.distcp",
                                                                                              "__1_0.distcp"]
    # one start line (the user's process) and one summary (rank 0), the start time shared
    assert res.stdout.count("rlforge train: start |") == 1 and "device cpu x 2 processes" in res.stdout
    assert res.stdout.count("rlforge train: done in ") == 1, res.stdout
    assert f"| model {tmp_path / 'global_step_2'}" in res.stdout
    # resume the 2-process checkpoint in one process (local engine)
    res = rlforge("trainer.total_training_steps=3", f"trainer.default_local_dir={tmp_path}")
    assert res.returncode == 0, failure(res)
    assert "resumed from" in res.stdout
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_dynamic_sampling_limit_is_decided_by_all_ranks(tmp_path):
    # arithmetic on a random model: every group has zero spread on both ranks; both must stop
    # together with the same clear error (no rank left waiting in a collective).
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    res = subprocess.run(
        [sys.executable, "-m", "rlforge.cli", "train", "actor_rollout_ref.model.path=preset:tiny", "trainer.device=cpu",
         "trainer.n_gpus_per_node=2", "trainer.total_training_steps=1", "trainer.val_before_train=false",
         "data.max_response_length=2", "algorithm.filter_groups.enable=true",
         "algorithm.filter_groups.max_num_gen_batches=2", "trainer.logger=[file]", f"trainer.default_local_dir={tmp_path}"],
        capture_output=True, text=True, env=env, timeout=200,
    )
    assert res.returncode == 2
    # every rank that got this far says so; the launcher may stop the slower rank first
    assert 1 <= res.stderr.count("max_num_gen_batches=2 generation batches") <= 2
    assert "Traceback" not in res.stderr


def test_two_process_on_policy_skip_matches_the_recomputed_old_log_probs(fsdp2_run, tmp_path):
    """FSDP2 on two ranks: ``old_log_prob`` taken from the update's forward (the default here:
    ppo_mini_batch_size = train_batch_size; fsdp2_run) gives the first step's entropy and loss of
    the same run that recomputes it in a separate forward (same seed, same samples, same weights)."""
    _, _, skip = fsdp2_run
    _, recompute = two_process_run(tmp_path, "fsdp2", "actor_rollout_ref.actor.recompute_old_log_prob=true")
    rows = {"skip": skip[0], "recompute": recompute[0]}
    assert "timing_s/old_log_prob" not in rows["skip"] and "timing_s/old_log_prob" in rows["recompute"]
    for key in ("actor/entropy", "actor/pg_loss", "actor/grad_norm"):
        assert rows["skip"][key] == pytest.approx(rows["recompute"][key], rel=1e-4, abs=1e-6), key


def test_two_process_tensor_parallel_rollout_trains_and_resumes(tmp_path):
    """``rollout.name=native rollout.tensor_model_parallel_size=2`` on 2 processes: one rollout group
    of both ranks.  The rollout's log-probs equal the trainer's forward at every step, also after the
    weight syncs (each rank its slice), and a resume checks the checkpoint against the full shapes
    (the rollout's own copy holds only slices)."""
    tp = ["actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
          "actor_rollout_ref.rollout.calculate_log_probs=true", "data.max_response_length=4"]
    _, rows = two_process_run(tmp_path, "fsdp2", *tp)
    res = rlforge("trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.strategy=fsdp2",
                  "trainer.total_training_steps=3", f"trainer.default_local_dir={tmp_path}", *tp)
    assert res.returncode == 0, failure(res)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["training/global_step"] for r in rows] == [1.0, 2.0, 3.0]
    assert all(r["training/rollout_probs_diff_max"] < 1e-5 for r in rows), [r["training/rollout_probs_diff_max"]
                                                                              for r in rows]

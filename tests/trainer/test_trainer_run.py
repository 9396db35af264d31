"""End-to-end training runs on ``preset:tiny`` through ``rlforge.cli.main`` (in-process, CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import FAST, SMALL

from rlforge.cli import main
from rlforge.perf.run_data import load_run

pytestmark = pytest.mark.e2e


def run(tmp: Path, *extra: str) -> list[dict]:
    rc = main(["train", *SMALL, f"trainer.default_local_dir={tmp}", *extra])
    assert rc == 0
    return [json.loads(line) for line in (tmp / "metrics.jsonl").read_text().splitlines()]


STEP_METRICS = [
    *(f"critic/score/{s}" for s in ("mean", "max", "min")),
    "critic/rewards/mean",
    *(f"critic/advantages/{s}" for s in ("mean", "max", "min")),
    "critic/returns/mean",
    *(f"response_length/{s}" for s in ("mean", "max", "min", "clip_ratio")),
    "prompt_length/mean",
    *(f"actor/{s}" for s in ("pg_loss", "pg_clipfrac", "ppo_kl", "entropy", "grad_norm", "lr")),
    *(f"perf/{s}" for s in ("throughput", "time_per_step", "total_num_tokens")),
    "training/global_step",
    "training/epoch",
    *(f"timing_s/{s}" for s in ("gen", "reward", "old_log_prob", "adv", "update_actor", "step")),
    "val-core/rlforge/arithmetic/reward/mean@1",
]


def test_grpo_run_logs_verl_metrics(tmp_path):
    rows = run(tmp_path, "trainer.total_training_steps=2", "trainer.logger=[console,file]", "trainer.test_freq=1")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert set(rows[0]) - {"step", "timing_s/testing"} == {"val-core/rlforge/arithmetic/reward/mean@1"}
    for r in rows[1:]:
        missing = [k for k in STEP_METRICS if k not in r]
        assert not missing, f"step {r['step']} lacks {missing}"
        assert r["training/global_step"] == r["step"]
        assert r["response_length/min"] >= 1
        assert r["response_length/max"] <= 8
        assert r["response_length/min"] <= r["response_length/mean"] <= r["response_length/max"]
        assert 0.0 <= r["critic/score/mean"] <= 1.0
        assert 0.0 <= r["val-core/rlforge/arithmetic/reward/mean@1"] <= 1.0
        assert r["critic/score/min"] <= r["critic/score/mean"] <= r["critic/score/max"]
        assert r["critic/rewards/mean"] == r["critic/score/mean"]  # no KL in the reward
        assert r["actor/lr"] == pytest.approx(1e-5)  # the default job's lr, constant schedule
        assert r["perf/total_num_tokens"] > 0 and r["perf/throughput"] > 0
        assert r["timing_s/step"] >= r["timing_s/gen"] + r["timing_s/update_actor"]
        assert "timing_s/ref" not in r and "actor/kl_loss" not in r
        assert "critic/vf_loss" not in r and "timing_s/values" not in r
    assert rows[1]["training/epoch"] == 0


def test_kl_loss_runs_reference(tmp_path):
    rows = run(tmp_path, *FAST, "trainer.total_training_steps=1", "actor_rollout_ref.actor.use_kl_loss=True")
    (r,) = rows
    assert "timing_s/ref" in r
    assert "actor/kl_loss" in r
    # before the first update the actor is the reference: the KL is zero
    assert r["actor/kl_loss"] == pytest.approx(0.0, abs=1e-6)


SPREAD_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
                "    return float(len(solution_str) % 3)\n"


def test_gae_trains_critic(tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text(SPREAD_REWARD)  # scores 0, 1 or 2: the returns have something to follow
    rows = run(tmp_path, *FAST, "trainer.total_training_steps=1", "algorithm.adv_estimator=gae",
               "critic.model.path=preset:tiny", f"custom_reward_function.path={reward}")
    (r,) = rows
    for k in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm",
              "timing_s/values", "timing_s/update_critic", "actor/pg_loss"):
        assert k in r, k
    # gamma = lam = 1 (the defaults) and the score on the last token: every token's return is its
    # sequence's score, whatever the critic predicts; the advantages are whitened (mean 0)
    assert r["critic/rewards/max"] > r["critic/rewards/min"]
    assert r["critic/returns/max"] == pytest.approx(r["critic/rewards/max"], abs=1e-5)
    assert r["critic/returns/min"] == pytest.approx(r["critic/rewards/min"], abs=1e-5)
    assert r["critic/advantages/mean"] == pytest.approx(0.0, abs=1e-5)
    assert r["critic/grad_norm"] > 0 and r["critic/vf_loss"] > 0


def test_kl_in_reward_adaptive(tmp_path):
    rows = run(tmp_path, *FAST, "trainer.total_training_steps=2", "algorithm.use_kl_in_reward=True",
               "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.1")
    for r in rows:
        assert "actor/reward_kl_penalty" in r and "actor/reward_kl_penalty_coeff" in r
        assert "timing_s/ref" in r
    # step 1: actor == reference, so the penalty is zero and rewards equal scores
    assert rows[0]["actor/reward_kl_penalty"] == pytest.approx(0.0, abs=1e-6)
    assert rows[0]["actor/reward_kl_penalty_coeff"] == pytest.approx(0.1)
    assert rows[1]["actor/reward_kl_penalty_coeff"] != pytest.approx(0.1)  # adaptive: the coefficient moved


RESUME_KEYS = ["critic/score/mean", "actor/pg_loss", "actor/entropy", "response_length/mean", "actor/grad_norm",
               "actor/ppo_kl"]


def test_save_and_resume_reproduces_uninterrupted_run(tmp_path):
    # make the run depend on the weights: a larger lr, so a lost optimizer state or a wrong RNG shows
    common = [*FAST, "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.entropy_coeff=0.01",
              "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]"]  # the default job: HF only
    a = run(tmp_path / "a", *common, "trainer.total_training_steps=3", "trainer.save_freq=-1")
    b_dir = tmp_path / "b"
    b1 = run(b_dir, *common, "trainer.total_training_steps=2", "trainer.save_freq=2")
    assert [r["step"] for r in b1] == [1, 2]
    ckpt = b_dir / "global_step_2"
    assert (ckpt / "trainer_state.pt").is_file()
    assert (ckpt / "actor" / ".metadata").is_file() and not (ckpt / "actor" / "state.pt").exists()  # sharded (DCP)
    assert (b_dir / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    assert not [p.name for p in b_dir.iterdir() if p.name.startswith(".global_step_")]

    b = run(b_dir, *common, "trainer.total_training_steps=3", "trainer.save_freq=-1", "trainer.resume_mode=auto")
    assert [r["step"] for r in b] == [1, 2, 3]  # the file logger appends on resume
    for k in RESUME_KEYS:
        assert b[1][k] == pytest.approx(a[1][k], rel=1e-6, abs=1e-9), k  # same first two steps
        assert b[2][k] == pytest.approx(a[2][k], rel=1e-6, abs=1e-9), k
    assert a[2]["actor/pg_loss"] != a[1]["actor/pg_loss"] or a[2]["actor/entropy"] != a[1]["actor/entropy"]


def test_another_run_in_the_folder_stops_and_disable_starts_over_in_a_sub_folder(tmp_path, capsys):
    first = run(tmp_path, *FAST, "trainer.total_training_steps=1", "trainer.save_freq=1")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    # another run (other response length) started in the same folder: one error, before anything is built
    capsys.readouterr()
    rc = main(["train", *SMALL, f"trainer.default_local_dir={tmp_path}", *FAST, "trainer.total_training_steps=1",
               "data.max_response_length=4"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlforge: error: ")]
    assert rc == 2 and len(err) == 1 and "data.max_response_length: 8 -> 4" in err[0], err
    assert "trainer.experiment_name=" in err[0] and "trainer.resume_mode=disable" in err[0], err
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    # resume_mode=disable: a fresh sub-folder; the earlier run's files stay as they were
    assert main(["train", *SMALL, f"trainer.default_local_dir={tmp_path}", *FAST, "trainer.total_training_steps=1",
                 "trainer.save_freq=1", "trainer.resume_mode=disable"]) == 0
    out = capsys.readouterr().out
    assert f"this run starts over in {tmp_path / 'run-1'}" in out
    saved = [line for line in out.splitlines() if line.startswith("saved the final checkpoint (step 1) in ")]
    assert len(saved) == 1 and saved[0].split(" in ")[1].endswith(" s as training saw it"), out
    rows = [json.loads(line) for line in (tmp_path / "run-1" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and (tmp_path / "run-1" / "global_step_1" / "config.yaml").is_file()
    assert {p: p.read_bytes() for p in before} == before and not list(tmp_path.glob("metrics.*.jsonl"))
    # `rlforge perf report` on the folder reads the first run alone
    (report,) = load_run(tmp_path).rows
    assert report["step"] == 1 and report["timing_s/step"] == first[0]["timing_s/step"] != rows[0]["timing_s/step"]

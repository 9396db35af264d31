"""Several nodes on one machine: torchrun launchers on localhost, each a "node" of CPU ranks (gloo).

* Two launchers of 2 ranks that meet through a c10d rendezvous train the same first two steps as
  one launcher of 4 ranks (the README's several-node commands).
* ``--max-restarts 1``: a rank killed with SIGKILL after a checkpoint restarts the group, which
  resumes from the latest checkpoint and ends where an uninterrupted run ends.
* ``rlforge launch`` on two nodes that disagree on ``trainer.nnodes``: one error line each.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
JOB = ["actor_rollout_ref.model.path=preset:tiny", "actor_rollout_ref.model.tokenizer_path=builtin:integers",
       "trainer.device=cpu", "data.train_files=builtin:distribution", "data.val_files=null",
       "data.max_prompt_length=16", "data.max_response_length=1", "data.train_batch_size=4",
       "data.builtin.train_size=16", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
       "actor_rollout_ref.actor.optim.lr=1e-3", "trainer.val_before_train=false", "trainer.logger=[file]"]
KEYS = ["actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/score/mean", "critic/rewards/mean",
        "critic/vf_loss"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_WORLD_SIZE")}
    e.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return e


def start(*args: str, log: Path) -> subprocess.Popen:
    """``python ARGS`` from the repository root, stdout and stderr into ``log`` (.out / .err)."""
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env(), stdout=log.with_suffix(".out").open("w"),
                            stderr=log.with_suffix(".err").open("w"))


def finish(procs: list[subprocess.Popen], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def torchrun(*flags: str) -> list[str]:
    return ["-m", "torch.distributed.run", *flags, "-m", "rlforge.trainer.main_ppo", *JOB]


def test_two_nodes_of_two_ranks_train_like_one_node_of_four(tmp_path):
    one = start(*torchrun("--standalone", "--nproc-per-node", "4"), "trainer.total_training_steps=2",
                f"trainer.default_local_dir={tmp_path / 'one'}", log=tmp_path / "one")
    assert finish([one], 300) == [0], (tmp_path / "one.err").read_text()[-3000:]
    endpoint = f"localhost:{free_port()}"
    nodes = [start(*torchrun("--nnodes", "2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
                             "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes"),
                   "trainer.total_training_steps=2", f"trainer.default_local_dir={tmp_path / 'two'}",
                   log=tmp_path / f"node{i}") for i in range(2)]
    assert finish(nodes, 300) == [0, 0], (tmp_path / "node0.err").read_text()[-3000:]
    a, b = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert [r["step"] for r in a] == [r["step"] for r in b] == [1, 2]
    assert a[1]["actor/grad_norm"] != a[0]["actor/grad_norm"] and a[0]["actor/grad_norm"] > 0  # the policy moves
    for ra, rb in zip(a, b, strict=True):
        for k in KEYS:
            assert rb[k] == pytest.approx(ra[k], abs=1e-6, rel=0), (ra["step"], k)


def _kill_rank_after_save(launcher: subprocess.Popen, run: Path, step: int, rank: str, timeout: float) -> None:
    """Wait for checkpoint ``step`` (verl's tracker file), then SIGKILL the launcher's worker ``rank``."""
    import psutil

    tracker = run / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and launcher.poll() is None:
        if tracker.is_file() and tracker.read_text().strip() == str(step):
            for child in psutil.Process(launcher.pid).children():
                if child.environ().get("RANK") == rank:
                    os.kill(child.pid, signal.SIGKILL)
                    return
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint {step} to kill after (launcher exit {launcher.poll()})")


def test_a_killed_rank_restarts_and_resumes_from_the_latest_checkpoint(tmp_path):
    # greedy rollouts: the checkpoint holds rank 0's RNG state only, so sampled rollouts of
    # rank 1 after a resume would differ from the uninterrupted run's (issue 40, point 1)
    job = ["trainer.total_training_steps=3", "trainer.save_freq=1", "trainer.resume_mode=auto",
           "actor_rollout_ref.rollout.do_sample=false",
           "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]"]
    flags = ("--standalone", "--nproc-per-node", "2", "--max-restarts", "1")
    whole = start(*torchrun(*flags), *job, f"trainer.default_local_dir={tmp_path / 'whole'}", log=tmp_path / "whole")
    assert finish([whole], 300) == [0], (tmp_path / "whole.err").read_text()[-3000:]
    run = tmp_path / "killed"
    killed = start(*torchrun(*flags), *job, f"trainer.default_local_dir={run}", log=run)
    _kill_rank_after_save(killed, run, 1, "1", 300)
    assert finish([killed], 300) == [0], run.with_suffix(".err").read_text()[-3000:]
    out = run.with_suffix(".out").read_text()
    resumed = [line for line in out.splitlines() if line.startswith("resumed from ")]
    assert len(resumed) == 1, out  # one restart
    saved = int(resumed[0].rsplit(" ", 1)[1])  # "... at step K"
    steps = [r["step"] for r in rows(run)]
    assert sorted(set(steps)) == [1, 2, 3] and steps[-1] == 3
    # steps up to the checkpoint ran once; only those after it may have been logged twice
    assert all(steps.count(s) == 1 for s in range(1, saved + 1)), steps
    assert len(steps) - 3 <= 3 - saved, steps
    final = {r["step"]: r for r in rows(run)}  # the last row of each step
    for s, r in enumerate(rows(tmp_path / "whole"), start=1):
        for k in KEYS:
            assert final[s][k] == pytest.approx(r[k], abs=1e-6, rel=0), (s, k)


def test_launchers_that_disagree_on_nnodes_stop_with_one_line_each(tmp_path):
    endpoint = f"localhost:{free_port()}"
    nodes = [start("-m", "rlforge.cli", "launch", "--rdzv-endpoint", endpoint, "--join-timeout", "20", *JOB,
                   "trainer.n_gpus_per_node=1", f"trainer.nnodes={n}", "data.train_batch_size=12",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=12",  # 48 samples: split over 2 and 3 ranks alike
                   f"trainer.default_local_dir={tmp_path / 'run'}", log=tmp_path / f"node{n}") for n in (2, 3)]
    codes = finish(nodes, 240)
    assert codes == [2, 2], codes
    for n in (2, 3):
        err = (tmp_path / f"node{n}.err").read_text()
        lines = [line for line in err.splitlines() if line.startswith("rlforge: error: ")]
        assert len(lines) == 1, err[-3000:]
        # the rendezvous fails (both name the endpoint), or, where the 2-node one closes first and the other joins
        # it, rlforge's own check names each rank's trainer.nnodes on both nodes (the 2-node one must not wait)
        assert ((f"trainer.nnodes={n}, torchrun --nnodes={n}" in lines[0] and endpoint in lines[0])
                or ("trainer.nnodes differs between the nodes torchrun's rendezvous joined (2 node(s)" in lines[0]
                    and "trainer.nnodes=2 on rank(s)" in lines[0] and "trainer.nnodes=3 on rank(s)" in lines[0])
                ), lines[0]
        assert "Traceback" not in err, err[-3000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists()

"""``rlforge launch``: the SLURM script it prints, the torchrun line it runs, and its one-line
errors (no processes: the multi-node runs are in tests/distributed/test_multinode.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlforge.cli import main

EXPECTED = Path(__file__).resolve().parents[1] / "fixtures" / "launch" / "expected.sbatch"


def test_slurm_script_is_derived_from_nnodes_and_gpus_per_node(capsys):
    # the expected file was checked by hand: 4 nodes x 8 GPUs, one torchrun task per node, the
    # rendezvous on the first hostname of the allocation, the overrides passed on quoted
    argv = ["launch", "--slurm", "--max-restarts", "1", "--job-name", "grpo-7b", "trainer.nnodes=4",
            "trainer.n_gpus_per_node=8", "data.train_files=~/data/gsm8k/train.parquet", "data.train_batch_size=256",
            "trainer.logger=[console,file]", "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct"]
    assert main(argv) == 0
    assert capsys.readouterr().out == EXPECTED.read_text()


def test_the_script_quotes_what_bash_would_split():
    from rlforge.slurm import SlurmJob, sbatch_script

    text = sbatch_script(SlurmJob(2, 4, ["--job", "none", "trainer.experiment_name=a b", "x=$HOME"]))
    last = text.splitlines()[-1]
    assert last.endswith("-m rlforge.cli train --job none 'trainer.experiment_name=a b' 'x=$HOME'")
    assert "--nnodes 2 --nproc-per-node 4" in last and "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=4" in text


def test_without_an_endpoint_launch_says_which_flag_it_needs(capsys):
    assert main(["launch", "trainer.nnodes=2", "trainer.device=cpu", "data.train_files=builtin:arithmetic"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlforge: error: rlforge launch needs --rdzv-endpoint HOST:PORT (the first node's address and a "
                   "free port, the same on every node), or --slurm for a batch script"]


def test_a_failed_rendezvous_is_one_line_with_the_keys():
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError, RendezvousTimeoutError

    from rlforge.multinode import rendezvous_message

    msg = rendezvous_message(RendezvousTimeoutError(), 2, "node0:29500", 30)
    assert msg == ("the rendezvous at node0:29500 did not complete within 30 s: every node must run the same command "
                   "with the same trainer.nnodes (this one: trainer.nnodes=2, torchrun --nnodes=2) and reach node0:29500")
    assert rendezvous_message(RendezvousConnectionError("x"), 3, "h:1", 30).startswith(
        "lost the rendezvous at h:1 (its host's launcher stopped or is unreachable): every node")


def test_the_node_runs_the_documented_torchrun_line():
    import argparse

    from rlforge.config import load_config
    from rlforge.multinode import torchrun_args

    args = argparse.Namespace(rdzv_endpoint="h:29500", rdzv_id="r1", join_timeout=60, max_restarts=1,
                              job=None, config_file=None, overrides=["trainer.nnodes=2", "trainer.n_gpus_per_node=4"])
    cfg = load_config(args.overrides, job="default")
    assert torchrun_args(cfg, args) == [
        "--nnodes", "2", "--nproc-per-node", "4", "--rdzv-backend", "c10d", "--rdzv-endpoint", "h:29500",
        "--rdzv-id", "r1", "--rdzv-conf", "join_timeout=60", "--max-restarts", "1", "-m", "rlforge.cli", "train",
        "--job", "default", "trainer.nnodes=2", "trainer.n_gpus_per_node=4"]


BASE = ["trainer.nnodes=2", "trainer.device=cpu", "data.train_files=builtin:arithmetic"]


def _one_error_line(capsys, argv):
    assert main(["launch", *argv, *BASE]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rlforge: error: "), err
    return err[0]



@pytest.mark.parametrize("endpoint", ["node0", "node0:", ":29500", "node0:0", "node0:65536", "node0:http", "node0:-1"])
def test_a_bad_rendezvous_endpoint_is_one_line(capsys, endpoint):
    line = _one_error_line(capsys, ["--rdzv-endpoint", endpoint])
    assert f"--rdzv-endpoint {endpoint!r} must be HOST:PORT" in line and "1 to 65535" in line


@pytest.mark.parametrize("endpoint", ["node0:1", "10.0.0.1:65535", "[::1]:29500"])
def test_good_endpoints_pass_the_check(endpoint):
    from rlforge.multinode import check_endpoint

    check_endpoint(endpoint)  # no error


def test_negative_restarts_and_non_positive_join_timeout_are_one_line(capsys):
    assert _one_error_line(capsys, ["--slurm", "--max-restarts", "-1"]) == (
        "rlforge: error: --max-restarts must be 0 or more, got -1")
    assert _one_error_line(capsys, ["--rdzv-endpoint", "h:29500", "--join-timeout", "0"]) == (
        "rlforge: error: --join-timeout must be a number of seconds > 0, got 0")


@pytest.mark.parametrize("name", ["a\n#SBATCH --time=1", "x;rm -rf ~", "a b", "$(id)", ""])
def test_a_job_name_that_would_inject_into_the_script_is_refused(capsys, name):
    line = _one_error_line(capsys, ["--slurm", "--job-name", name])
    assert "--job-name" in line and "letters, digits" in line
    assert capsys.readouterr().out == ""  # no script printed


def test_job_name_without_slurm_is_one_line(capsys):
    line = _one_error_line(capsys, ["--rdzv-endpoint", "h:29500", "--job-name", "ok"])
    assert line == "rlforge: error: --job-name names the SLURM job and is used only with --slurm; add --slurm or drop it"

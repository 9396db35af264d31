"""A SLURM batch script for a multi-node run: ``rlforge launch --slurm [train args]``.

The job's shape comes from the config: ``#SBATCH --nodes`` = ``trainer.nnodes``, one task per
node, ``--gpus-per-node`` = ``trainer.n_gpus_per_node``.  Each node's task is one ``torchrun``
(``srun`` starts it on every node) that meets the others through a c10d rendezvous on the first
node's hostname, taken from ``scontrol show hostnames "$SLURM_JOB_NODELIST"`` (the form torchtitan's
and prime-rl's SLURM scripts use).  Pure text, no torch: the script is written where SLURM is, and
run there with ``sbatch``.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

RDZV_PORT = 29500
"""The rendezvous port on the first node (torchrun's usual one)."""


@dataclass(frozen=True)
class SlurmJob:
    """What the script asks SLURM for and passes to torchrun.

    ``nnodes`` and ``gpus_per_node`` are ``trainer.nnodes`` and ``trainer.n_gpus_per_node``;
    ``train_args`` are the worker's arguments after ``-m rlforge.cli train``; ``max_restarts`` is
    torchrun's ``--max-restarts`` (a failed rank restarts the group, which resumes from the latest
    checkpoint with ``trainer.resume_mode=auto``).
    """

    nnodes: int
    gpus_per_node: int
    train_args: Sequence[str]
    job_name: str = "rlforge"
    max_restarts: int = 0
    port: int = RDZV_PORT


def torchrun_line(job: SlurmJob, endpoint: str) -> list[str]:
    """``torchrun --nnodes N --nproc-per-node P --rdzv-backend c10d --rdzv-endpoint ENDPOINT ...``
    as arguments (``endpoint`` is ``HOST:PORT``, or a shell expression the script expands)."""
    return ["torchrun", "--nnodes", str(job.nnodes), "--nproc-per-node", str(job.gpus_per_node),
            "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "$SLURM_JOB_ID",
            "--max-restarts", str(job.max_restarts), "-m", "rlforge.cli", "train", *job.train_args]


def _shell(args: Sequence[str]) -> str:
    """Arguments quoted for bash; ``$VAR`` ones in double quotes so that the script expands them."""
    return " ".join(f'"{a}"' if a.startswith("$") else shlex.quote(a) for a in args)


def sbatch_script(job: SlurmJob) -> str:
    """The batch script's text (ends with a newline)."""
    cmd = torchrun_line(job, f"$head_node:{job.port}")
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name={job.job_name}",
        f"#SBATCH --nodes={job.nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={job.gpus_per_node}",
        "#SBATCH --exclusive",
        f"# from trainer.nnodes={job.nnodes} and trainer.n_gpus_per_node={job.gpus_per_node} "
        "(rlforge launch --slurm); submit with: sbatch FILE",
        "set -euo pipefail",
        'nodes=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        'head_node="${nodes[0]}"',
        "# one torchrun per node; they meet at the first node's rendezvous",
        f"srun --nodes={job.nnodes} --ntasks-per-node=1 {_shell(cmd)}",
        "",
    ])

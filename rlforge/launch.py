"""Launch ``rlforge train`` as one process per device through torch's elastic launcher.

``trainer.n_gpus_per_node=K`` (K > 1) on one node: ``rlforge train`` re-runs itself as
``torchrun --standalone --nproc_per_node=K -m rlforge.cli train ...`` in-process (through
``torch.distributed.run``).  On a CPU-only machine (``trainer.device=cpu``) the K processes
use gloo: the same code path, useful for tests.  ``trainer.nnodes=N`` (N > 1) needs one
launch per node with a rendezvous endpoint; rlforge prints the exact command instead.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

import torch

from rlforge.errors import ConfigError


def under_launcher() -> bool:
    """True inside a torchrun worker (``WORLD_SIZE`` is set)."""
    return "WORLD_SIZE" in os.environ


def torchrun_command(cfg: Any, argv: Sequence[str]) -> list[str]:
    """The torchrun command line that runs this job on each node."""
    t = cfg.trainer
    cmd = ["torchrun", f"--nproc_per_node={t.n_gpus_per_node}"]
    if t.nnodes > 1:
        cmd += [f"--nnodes={t.nnodes}", "--rdzv_backend=c10d", "--rdzv_endpoint=$MASTER_ADDR:29500",
                "--rdzv_id=rlforge"]
    else:
        cmd += ["--standalone"]
    return cmd + ["-m", "rlforge.cli", "train", *argv]


def maybe_launch(cfg: Any, argv: Sequence[str]) -> int | None:
    """Launch the workers if this job needs several processes and we are not one of them.

    Returns the exit status when it launched (or refused), None when the caller should
    run the job itself.

    Raises:
        ConfigError: more processes per node than visible GPUs on a CUDA job.
    """
    t = cfg.trainer
    if t.nnodes * t.n_gpus_per_node <= 1 or under_launcher():
        return None
    if t.nnodes > 1:
        cmd = " ".join(shlex.quote(c) if "$" not in c else c for c in torchrun_command(cfg, argv))
        print(
            f"rlforge: trainer.nnodes={t.nnodes}: start this on every node (MASTER_ADDR = the first node's address):\n"
            f"  {cmd}",
            file=sys.stderr,
        )
        return 2
    wants_cuda = t.device.startswith("cuda") or (t.device == "auto" and torch.cuda.is_available())
    if wants_cuda and torch.cuda.device_count() < t.n_gpus_per_node:
        raise ConfigError(
            f"trainer.n_gpus_per_node={t.n_gpus_per_node} but {torch.cuda.device_count()} GPU(s) are visible; "
            "lower it or set CUDA_VISIBLE_DEVICES"
        )
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun_main

    args = torchrun_command(cfg, argv)[1:]
    try:
        torchrun_main(args)
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        print(f"rlforge: error: {len(codes)} worker process(es) failed (their messages are above)", file=sys.stderr)
        # a user error (exit 2, message printed) on one rank makes the launcher stop the others,
        # which then exit with a signal or 1: the run failed for the user's reason
        return 2 if 2 in codes else 1
    return 0

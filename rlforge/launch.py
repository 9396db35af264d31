"""Launch ``rlforge train`` as one process per device through torch's elastic launcher.

``trainer.n_gpus_per_node=K`` (K > 1) on one node: ``rlforge train`` re-runs itself as
``torchrun --standalone --nproc_per_node=K -m rlforge.cli train ...`` in-process (through
``torch.distributed.run``).  On a CPU-only machine (``trainer.device=cpu``) the K processes
use gloo: the same code path, useful for tests.  ``trainer.nnodes=N`` (N > 1) needs one
launch per node with a rendezvous endpoint; rlforge prints the ``rlforge launch`` command
(:mod:`rlforge.multinode`) to run on each node instead.

Under any launcher (``WORLD_SIZE`` set: torchrun, or the launch above) the world size is the
launcher's (:mod:`rlforge.config.world`), and a user error is printed once, by rank 0
(:func:`report_user_error`), and exits with status 2.  A user who runs ``torchrun`` directly
still gets torchrun's own failure summary after that line (torchrun exits 1 and names the
rank that exited 2); ``rlforge train trainer.n_gpus_per_node=K`` replaces it with one line.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Any

from rlforge.errors import ConfigError


def under_launcher() -> bool:
    """True inside a torchrun worker (``WORLD_SIZE`` is set)."""
    return "WORLD_SIZE" in os.environ


OTHER_RANKS_WAIT_S = 20.0
"""How long a rank other than 0 waits before printing a user error (see :func:`report_user_error`)."""


def report_user_error(message: str, wait_s: float | None = None) -> None:
    """Print ``rlforge: error: message`` once per run, without a traceback.

    Outside a launcher the process prints it.  Under one, every rank usually meets the same
    error (the config, the data and the model are the same everywhere), so rank 0 prints it and
    the other ranks first leave the process group and wait ``wait_s`` seconds (default
    :data:`OTHER_RANKS_WAIT_S`): rank 0 exits meanwhile and the launcher stops them, so the message
    appears once.  An error that only another rank meets is still printed by that rank after the
    wait, prefixed with its rank.  Leaving the process group (where one was joined) comes before
    the exit, so no rank exits with a live communicator.
    """
    rank = int(os.environ.get("RANK", "0") or 0) if under_launcher() else 0
    if rank == 0:
        print(f"rlforge: error: {message}", file=sys.stderr, flush=True)
    if under_launcher():
        _leave_process_group()
    if rank != 0:
        time.sleep(OTHER_RANKS_WAIT_S if wait_s is None else wait_s)
        print(f"rlforge: error: (rank {rank}) {message}", file=sys.stderr, flush=True)


def _leave_process_group(timeout_s: float = 10.0) -> None:
    """Destroy the default process group if this process joined one.  Best effort: a failure
    must not hide the user's error, and a communicator that waits for a peer (NCCL with work in
    flight) is left behind after ``timeout_s`` rather than blocking the exit."""
    import threading

    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return

    def destroy() -> None:
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the user's error is what matters now
            pass

    worker = threading.Thread(target=destroy, name="rlforge-leave-process-group", daemon=True)
    worker.start()
    worker.join(timeout_s)


def torchrun_command(cfg: Any, argv: Sequence[str]) -> list[str]:
    """The torchrun command line that runs this one-node job (several nodes: :mod:`rlforge.multinode`)."""
    t = cfg.trainer
    return ["torchrun", f"--nproc_per_node={t.n_gpus_per_node}", "--standalone", "-m", "rlforge.cli", "train", *argv]


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
        cmd = " ".join(shlex.quote(c) for c in argv)
        print(
            f"rlforge: trainer.nnodes={t.nnodes}: start this on every node (HOST = the first node's address, "
            f"PORT a free port there; docs/multinode.md):\n"
            f"  rlforge launch --rdzv-endpoint HOST:PORT {cmd}\n"
            f"or `rlforge launch --slurm {cmd}` for a SLURM batch script",
            file=sys.stderr,
        )
        return 2
    import torch  # here, not at the top: a user error is reported (report_user_error) before torch loads

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
        # a user error (exit 2, its one message printed by rank 0) makes the launcher stop the
        # others, which then exit with a signal or 1: the run failed for the user's reason, and
        # that message is the one line to show
        if 2 in codes:
            return 2
        print(f"rlforge: error: {len(codes)} worker process(es) failed (exit codes {sorted(set(codes))}; "
              "their messages are above)", file=sys.stderr)
        return 1
    return 0

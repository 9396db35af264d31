"""``rlforge launch``: one node's share of a multi-node run, or its SLURM script.

    rlforge launch --rdzv-endpoint HOST:PORT [--rdzv-id ID] [--max-restarts K] [--join-timeout S]
                   [--config FILE] [--job NAME|none] [key=value ...]
    rlforge launch --slurm [--max-restarts K] [--job-name NAME] [--config FILE] [key=value ...]

On each node, ``rlforge launch`` runs torch's elastic launcher in-process with
``--nnodes trainer.nnodes --nproc-per-node trainer.n_gpus_per_node --rdzv-backend c10d
--rdzv-endpoint HOST:PORT``, the workers being ``rlforge train`` with the same arguments.  That is
the documented ``torchrun`` line (docs/multinode.md), plus one thing torchrun cannot do: a
rendezvous that fails (the launchers disagree on ``--nnodes``, or one never comes) is one
``rlforge: error:`` line naming ``trainer.nnodes`` and the endpoint, not torchrun's traceback.
``--slurm`` prints the batch script instead (:mod:`rlforge.slurm`).
"""

from __future__ import annotations

import argparse
import re
import sys
from typing import Any

from rlforge.errors import ConfigError

DEFAULT_JOIN_TIMEOUT_S = 600
"""How long a launcher waits for the other nodes (torchrun's default ``join_timeout``)."""


def add_launch_parser(sub: Any) -> None:
    """The ``launch`` sub-command's flags (the rest of the line is ``rlforge train``'s overrides)."""
    p = sub.add_parser("launch", help="start this node's ranks of a multi-node run, or print its SLURM script",
                       description="Start this node's trainer.n_gpus_per_node ranks of a trainer.nnodes-node "
                       "run (torchrun with a c10d rendezvous), or print a SLURM batch script (--slurm).")
    p.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                   help="the rendezvous: the first node's address and a free port, the same on every node")
    p.add_argument("--rdzv-id", default="rlforge", metavar="ID", help="the run's id, the same on every node")
    p.add_argument("--max-restarts", type=int, default=0, metavar="K",
                   help="restart the ranks up to K times after a failure (resumes from the latest checkpoint "
                   "with trainer.resume_mode=auto)")
    p.add_argument("--join-timeout", type=int, default=DEFAULT_JOIN_TIMEOUT_S, metavar="S",
                   help=f"seconds to wait for the other nodes (default {DEFAULT_JOIN_TIMEOUT_S})")
    p.add_argument("--slurm", action="store_true", help="print an sbatch script for this job and exit")
    p.add_argument("--job-name", default=None, help="the SLURM job's name (--slurm; default rlforge): "
                   "letters, digits, '.', '_' and '-'")
    p.add_argument("--config", dest="config_file", default=None, help="YAML file of config values")
    p.add_argument("--job", default=None, help="embedded job to start from (as for rlforge train)")
    p.add_argument("overrides", nargs="*", help="key=value overrides (as for rlforge train)")


def train_args(args: argparse.Namespace) -> list[str]:
    """The workers' arguments after ``rlforge.cli train``."""
    return ["--job", args.job or "default", *(["--config", args.config_file] if args.config_file else []),
            *args.overrides]


def torchrun_args(cfg: Any, args: argparse.Namespace) -> list[str]:
    """torchrun's arguments for this node (``torch.distributed.run.main``'s ``args``)."""
    t = cfg.trainer
    return ["--nnodes", str(t.nnodes), "--nproc-per-node", str(t.n_gpus_per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", args.rdzv_endpoint, "--rdzv-id", args.rdzv_id,
            "--rdzv-conf", f"join_timeout={args.join_timeout}", "--max-restarts", str(args.max_restarts),
            "-m", "rlforge.cli", "train", *train_args(args)]


def rendezvous_message(exc: BaseException, nnodes: int, endpoint: str, join_timeout: int) -> str:
    """The one line for a failed rendezvous (``exc``: one of torch's ``Rendezvous*Error``)."""
    same = (f"every node must run the same command with the same trainer.nnodes (this one: trainer.nnodes={nnodes}, "
            f"torchrun --nnodes={nnodes}) and reach {endpoint}")
    name = type(exc).__name__
    if name == "RendezvousTimeoutError":
        return f"the rendezvous at {endpoint} did not complete within {join_timeout} s: {same}"
    if name == "RendezvousConnectionError":
        return f"lost the rendezvous at {endpoint} (its host's launcher stopped or is unreachable): {same}"
    return f"the rendezvous at {endpoint} failed ({name}: {exc}): {same}"


DEFAULT_JOB_NAME = "rlforge"
"""The SLURM job's name when ``--job-name`` is not given."""

_JOB_NAME = re.compile(r"[A-Za-z0-9._-]+")


def check_endpoint(endpoint: str) -> None:
    """Refuse an ``--rdzv-endpoint`` that is not ``HOST:PORT`` (a host, and a port 1..65535).

    Raises:
        ConfigError: naming the flag and the value.
    """
    host, sep, port = endpoint.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [IPv6]:PORT
    if not sep or not host.strip() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"--rdzv-endpoint {endpoint!r} must be HOST:PORT, a host and a port from 1 to 65535 "
                          "(e.g. node0:29500), the same on every node")


def check_launch_flags(args: argparse.Namespace) -> None:
    """The launcher's own flags checked before torch's launcher (or the SLURM script) sees them.

    Raises:
        ConfigError: a bad ``--rdzv-endpoint``, ``--max-restarts`` < 0, ``--join-timeout`` <= 0, a
            ``--job-name`` with characters other than letters, digits, ``.``, ``_``, ``-`` (it goes into
            the batch script), or ``--job-name`` without ``--slurm``.
    """
    if args.rdzv_endpoint is not None:
        check_endpoint(args.rdzv_endpoint)
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts must be 0 or more, got {args.max_restarts}")
    if args.join_timeout <= 0:
        raise ConfigError(f"--join-timeout must be a number of seconds > 0, got {args.join_timeout}")
    if args.job_name is not None:
        if not args.slurm:
            raise ConfigError("--job-name names the SLURM job and is used only with --slurm; add --slurm or drop it")
        if not _JOB_NAME.fullmatch(args.job_name):
            raise ConfigError(f"--job-name {args.job_name!r} may hold only letters, digits, '.', '_' and '-' "
                              "(it is written into the batch script)")


def run_launch(args: argparse.Namespace) -> int:
    """``rlforge launch``: print the SLURM script, or run this node's ranks; the exit status.

    Raises:
        ConfigError: a bad flag (:func:`check_launch_flags`), no ``--rdzv-endpoint`` (without ``--slurm``),
            or a failed rendezvous.
    """
    from rlforge.config import load_config, validate_config
    from rlforge.console_warnings import show_config_warnings

    check_launch_flags(args)
    cfg = load_config(list(args.overrides), config_file=args.config_file, job=None if args.job == "none" else
                      (args.job or "default"))
    show_config_warnings(validate_config(cfg))
    if args.slurm:
        from rlforge.slurm import SlurmJob, sbatch_script

        t = cfg.trainer
        print(sbatch_script(SlurmJob(t.nnodes, t.n_gpus_per_node, train_args(args), args.job_name or DEFAULT_JOB_NAME,
                                     args.max_restarts)), end="")
        return 0
    if not args.rdzv_endpoint:
        raise ConfigError("rlforge launch needs --rdzv-endpoint HOST:PORT (the first node's address and a free port, "
                          "the same on every node), or --slurm for a batch script")
    return _run_node(cfg, args)


def _run_node(cfg: Any, args: argparse.Namespace) -> int:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main(torchrun_args(cfg, args))
    except RendezvousError as e:
        raise ConfigError(rendezvous_message(e, cfg.trainer.nnodes, args.rdzv_endpoint, args.join_timeout)) from None
    except ChildFailedError as e:
        codes = sorted({f.exitcode for f in e.failures.values()})
        if 2 in codes:  # a user error, its one line printed by rank 0
            return 2
        print(f"rlforge: error: {len(e.failures)} worker process(es) failed (exit codes {codes}; "
              "their messages are above)", file=sys.stderr)
        return 1
    return 0


"""Process-group and device-mesh helpers: one code path for 1 and N processes.

Every helper is a no-op (or returns the single-process answer) when no default process
group is initialised, so callers never branch on the world size.

Launch: ``torchrun --nproc_per_node=N ...`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init_distributed` reads them.  Without
``WORLD_SIZE`` the process runs alone (rank 0 of 1) and no process group is created.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from rlforge.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits: global ``rank`` of ``world_size``, ``local_rank`` on its
    host, and the ``device`` it computes on (``cuda:local_rank`` or ``cpu``)."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device


def is_initialized() -> bool:
    """True when a default process group exists."""
    return dist.is_available() and dist.is_initialized()


def init_distributed(device_type: str = "cuda", timeout: timedelta | None = None) -> DistInfo:
    """Initialise the default process group from torchrun's environment variables.

    Args:
        device_type: ``cuda`` (NCCL backend, one GPU per local rank) or ``cpu`` (gloo).
        timeout: how long a collective may wait before it fails (``actor_rollout_ref.nccl_timeout``);
            None = torch's default.  An existing group keeps its own.
    Returns:
        This process's :class:`DistInfo`.  ``WORLD_SIZE`` unset (a plain ``python`` launch):
        rank 0 of 1 and no process group.  ``torchrun --nproc_per_node=1`` does create a
        1-rank group, so the FSDP engines run unchanged on one device.
    Raises:
        ConfigError: ``cuda`` asked for but no GPU is visible.
    """
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("trainer.device=cuda but no CUDA GPU is visible; use trainer.device=cpu")
    if is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", rank))
    elif "WORLD_SIZE" not in os.environ:
        rank, world, local = 0, 1, 0
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
        if device_type == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group("nccl" if device_type == "cuda" else "gloo", rank=rank, world_size=world,
                                timeout=timeout, store=restart_store(timeout))
    device = torch.device(f"cuda:{local}") if device_type == "cuda" else torch.device("cpu")
    return DistInfo(rank, world, local, device)


def restart_store(timeout: timedelta | None = None) -> dist.Store | None:
    """The store of a group restarted by torchrun (``--max-restarts``), or None for torch's ``env://``.

    torchrun's agent keeps one TCPStore (``TORCHELASTIC_USE_AGENT_STORE=True``) for every restart of
    its workers, and torch's ``env://`` handler adds no per-attempt prefix: a restarted group would
    read the previous attempt's keys (the dead ranks' gloo addresses, NCCL ids) and fail to connect.
    Restarted workers (``TORCHELASTIC_RESTART_COUNT`` > 0) therefore take their keys under
    ``rlforge/attempt_<n>/`` of the agent's store.
    """
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if attempt == 0:
        return None
    return agent_store(f"rlforge/attempt_{attempt}/", timeout or timedelta(minutes=30))


def agent_store(prefix: str, timeout: timedelta) -> dist.Store | None:
    """A client of torchrun's agent store (``MASTER_ADDR:MASTER_PORT``, kept across restarts), its keys under
    ``prefix``; None where torchrun keeps none (``TORCHELASTIC_USE_AGENT_STORE`` not ``True``)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    client = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                           timeout=timeout)
    return dist.PrefixStore(prefix, client)


def init_single_process(device: torch.device, timeout: timedelta | None = None) -> DistInfo:
    """A process group of one rank inside this process (no launcher, no network), so that the
    sharded engines (``strategy=fsdp2``/``fsdp``/``megatron``) run on one device with the same
    code, the same mesh semantics and the same keys as on N (torchtitan and nanochat do this).

    The store is an in-memory ``HashStore``; the backend is gloo for CPU tensors and, on
    CUDA, NCCL for CUDA tensors (``"cpu:gloo,cuda:nccl"``).  Reuses an existing group.

    Args:
        device: this process's compute device (``cpu``, ``cuda`` or ``cuda:N``).
        timeout: the group's collective timeout (see :func:`init_distributed`); None = torch's default.
    Raises:
        ConfigError: a CUDA device asked for but no GPU is visible.
    """
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError("trainer.device=cuda but no CUDA GPU is visible; use trainer.device=cpu")
        device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        torch.cuda.set_device(device)
    if not is_initialized():
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return DistInfo(dist.get_rank(), dist.get_world_size(), device.index or 0, device)


def finish_launched_worker() -> None:
    """End a torchrun worker's job cleanly: every rank meets at a barrier, then the process groups
    (the default one and every subgroup: rollout TP groups, the checkpointer's gloo group) are
    destroyed while Python is still running.

    Without it the groups are torn down during interpreter shutdown, and a gloo rank aborts there
    now and then (``terminate called without an active exception``, exit -6) after a job that
    succeeded.  torchtitan and verl also destroy the group at the end of training.  Does nothing
    outside a launcher (``WORLD_SIZE`` unset: an in-process 1-rank group stays for the caller).
    """
    if "WORLD_SIZE" not in os.environ or not is_initialized():
        return
    if dist.get_world_size() > 1:
        dist.barrier()  # no rank leaves while another still talks to it
    dist.destroy_process_group()


def get_rank() -> int:
    """Global rank; 0 without a process group."""
    return dist.get_rank() if is_initialized() else 0


def get_world_size() -> int:
    """World size; 1 without a process group."""
    return dist.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    """True on global rank 0 (and in a single process)."""
    return get_rank() == 0


def _all_reduce(values: list[float], op: dist.ReduceOp, device: torch.device) -> list[float]:
    if not is_initialized() or not values:
        return [float(v) for v in values]
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=op)
    return [float(v) for v in t.tolist()]


def all_reduce_sum(values: list[float], device: torch.device | str = "cpu") -> list[float]:
    """Element-wise sum over all ranks (float64); identity without a process group.
    ``device`` must suit the backend (a CUDA device for NCCL)."""
    return _all_reduce(values, dist.ReduceOp.SUM, torch.device(device))


def all_reduce_max(values: list[float], device: torch.device | str = "cpu") -> list[float]:
    """Element-wise max over all ranks; identity without a process group."""
    return _all_reduce(values, dist.ReduceOp.MAX, torch.device(device))


def build_mesh(device_type: str, fsdp_size: int = -1) -> DeviceMesh | None:
    """The data-parallel mesh: 1-D ``("shard",)`` over all ranks, or 2-D
    ``("replicate", "shard")`` for hybrid sharding (HSDP) when ``0 < fsdp_size < world``.

    Returns None without a process group (the trainer creates a one-rank group with
    :func:`init_single_process` for a single process).

    Raises:
        ConfigError: ``fsdp_size`` does not divide the world size.
    """
    if not is_initialized():
        return None
    world = dist.get_world_size()
    if fsdp_size <= 0 or fsdp_size >= world:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    if world % fsdp_size:
        raise ConfigError(f"fsdp_config.fsdp_size={fsdp_size} must divide the world size {world}")
    return init_device_mesh(device_type, (world // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard"))

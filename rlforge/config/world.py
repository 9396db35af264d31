"""The number of processes a run has: the launcher's, or the config's.

Under ``torchrun`` (or any launcher that sets ``WORLD_SIZE``) the world size is the launcher's:
``torchrun --nproc-per-node 4 -m rlforge.trainer.main_ppo ...`` needs no
``trainer.n_gpus_per_node=4``.  ``trainer.nnodes x trainer.n_gpus_per_node`` counts only where it
was changed from its default (``1 x 1``); then it must equal ``WORLD_SIZE``, or one
:class:`ConfigError` names both numbers and the key to change.  Without a launcher the world
size is ``trainer.nnodes x trainer.n_gpus_per_node`` (``rlforge train`` then starts that many
processes itself, :mod:`rlforge.launch`).

verl's defaults (``python -m rlforge.trainer.main_ppo``, ``rlforge train --job none``, ``rlforge check-config``)
take verl's meaning of an unset ``trainer.n_gpus_per_node`` (verl: 8, a node's GPUs): every GPU visible to the
process (:func:`node_gpus_from_verl_default`), so a verl script that leaves it out runs on the whole node as it
does in verl.  rlforge's own jobs keep one process unless told otherwise.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from rlforge.config.trainer import TrainerConfig
from rlforge.errors import ConfigError

_CONFIG_KEYS = "trainer.nnodes x trainer.n_gpus_per_node"


@dataclass(frozen=True)
class World:
    """``size`` processes in all; ``source`` says where the number came from (for messages)."""

    size: int
    source: str


def _check_nodes(nnodes: int) -> None:
    """``trainer.nnodes``, where set, against the nodes torchrun's rendezvous joined (``GROUP_WORLD_SIZE``),
    and, on several nodes, against every other rank's ``trainer.nnodes`` (:func:`_nnodes_of_every_rank`): a
    node whose own count matches must still stop when another node's does not, or it would wait for that
    node's ranks until the process group's timeout.

    Raises:
        ConfigError: they differ.
    """
    nodes = os.environ.get("GROUP_WORLD_SIZE", "")
    if not nodes.isdigit():
        return
    if int(nodes) > 1:
        declared = _nnodes_of_every_rank(nnodes)
        if len(set(declared)) > 1:
            by_value: dict[int, list[int]] = {}
            for rank, n in enumerate(declared):
                by_value.setdefault(n, []).append(rank)
            seen = "; ".join(f"trainer.nnodes={n} on rank(s) {', '.join(map(str, r))}" for n, r in by_value.items())
            raise ConfigError(
                f"trainer.nnodes differs between the nodes torchrun's rendezvous joined ({nodes} node(s), "
                f"GROUP_WORLD_SIZE={nodes}): {seen}; start every node with the same --nnodes and trainer.nnodes"
            )
    if nnodes != TrainerConfig.nnodes and int(nodes) != nnodes:
        raise ConfigError(
            f"trainer.nnodes={nnodes}, but torchrun's rendezvous joined {nodes} node(s) (GROUP_WORLD_SIZE={nodes}); "
            f"start every node with the same --nnodes and trainer.nnodes"
        )


_DECLARED: dict[str, list[int]] = {}
"""Every rank's ``trainer.nnodes``, per torchrun attempt (exchanged once per process)."""

EXCHANGE_TIMEOUT_S = 60.0
"""How long a rank waits for the others' ``trainer.nnodes`` before it checks its own alone."""


def _nnodes_of_every_rank(nnodes: int) -> list[int]:
    """Each rank's ``trainer.nnodes`` (index = rank), exchanged through torchrun's own store before any
    process group exists (every rank writes its value, then waits for all).  Where torchrun keeps no agent
    store, or a rank does not answer within :data:`EXCHANGE_TIMEOUT_S`, only this rank's value."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or "0"
    if attempt in _DECLARED:
        return _DECLARED[attempt]
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return [nnodes]
    from datetime import timedelta

    from rlforge.engine.distributed import agent_store

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=EXCHANGE_TIMEOUT_S)
    try:
        store = agent_store(f"rlforge/nnodes/attempt_{attempt}/", timeout)
        assert store is not None  # TORCHELASTIC_USE_AGENT_STORE checked above
        store.set(str(rank), str(nnodes))
        keys = [str(r) for r in range(world)]
        store.wait(keys, timeout)
        declared = [int(store.get(k)) for k in keys]
    except Exception:  # noqa: BLE001 - a peer gone or no store: the local check still runs
        declared = [nnodes]
    _DECLARED[attempt] = declared
    return declared


def visible_gpus() -> int:
    """CUDA devices this process may use, without importing torch: the ids of ``CUDA_VISIBLE_DEVICES`` up to
    the first invalid one (CUDA's rule) where it is set, else NVML's device count (0 without a driver)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        n = 0
        for part in env.split(","):
            if not part.strip() or part.strip().startswith("-"):
                break
            n += 1
        return n
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML library or driver: no GPU
        return 0


def node_gpus_from_verl_default(cfg: Any) -> None:
    """Under verl's defaults: an unset ``trainer.n_gpus_per_node`` becomes the number of visible GPUs (where
    more than one; module doc).  Not under a launcher (``WORLD_SIZE`` set: the launcher's count rules), not for
    ``trainer.device=cpu`` or one named GPU (``cuda:<i>``)."""
    from rlforge.config.user_keys import user_set

    t = cfg.trainer
    if os.environ.get("WORLD_SIZE") is not None or user_set(cfg, "trainer.n_gpus_per_node"):
        return
    if str(t.device) not in ("auto", "cuda"):
        return
    n = visible_gpus()
    if n > 1:
        t.n_gpus_per_node = n


def run_world(cfg: Any) -> World:
    """The run's world size: ``WORLD_SIZE`` when a launcher set it, else the config's.

    Raises:
        ConfigError: ``WORLD_SIZE`` is not a whole number >= 1, ``trainer.nnodes`` (where set) is not the
            number of nodes torchrun joined (``GROUP_WORLD_SIZE``), or ``trainer.nnodes x
            trainer.n_gpus_per_node`` was set (differs from its default) and disagrees with it.
    """
    nnodes, per_node = int(cfg.trainer.nnodes), int(cfg.trainer.n_gpus_per_node)
    configured = nnodes * per_node
    env = os.environ.get("WORLD_SIZE")
    if env is None:
        return World(configured, _CONFIG_KEYS)
    if not (env.strip().isdigit() and int(env) >= 1):
        raise ConfigError(f"the launcher's WORLD_SIZE={env!r} is not a process count (a whole number >= 1)")
    launched = int(env)
    _check_nodes(nnodes)
    default = TrainerConfig.nnodes * TrainerConfig.n_gpus_per_node
    if configured != default and configured != launched:
        if launched % nnodes == 0:
            fix = f"set trainer.n_gpus_per_node={launched // nnodes}"
        else:
            fix = f"set trainer.nnodes and trainer.n_gpus_per_node so that their product is {launched}"
        raise ConfigError(
            f"{_CONFIG_KEYS} = {nnodes} x {per_node} = {configured}, but the launcher started {launched} processes "
            f"(WORLD_SIZE={launched}); {fix}, or leave both unset to take the launcher's world size"
        )
    return World(launched, "WORLD_SIZE from the launcher")

"""Sharded, optionally asynchronous checkpoint saves (``global_step_N`` as in verl).

Each role (``actor``, ``critic``) whose engine has a sharded state (FSDP2, FSDP1) is written by
``torch.distributed.checkpoint`` (DCP): every rank writes its own shards of the model, the optimizer
and the LR schedule into ``global_step_N/<role>/`` (``.metadata`` + ``__<rank>_0.distcp``); nothing is
gathered.  Other engines (megatron, LoRA adapters) keep the full format, ``<role>/state.pt``.  Rank 0
writes ``trainer_state.pt`` (step, data-loader position, KL controller, its RNG states, and every rank's
RNG states as ``rng_per_rank``), ``config.yaml`` and the ``hf_model`` export.

Atomicity is :mod:`rlforge.trainer.checkpoint`'s: everything goes into rank 0's temporary folder,
which :func:`~rlforge.trainer.checkpoint.commit` hashes into ``manifest.json`` and renames into place
before the tracker file names it.  With ``<role>.checkpoint.async_save``, that role's save returns once
its shards are copied to host memory (pinned on CUDA) and is written by a background thread on a gloo
group of its own; rank 0 commits when its DCP save completes (DCP's coordinator finishes only after
every rank's write).  At most one save is in flight: the next save, and the end of the run, wait for
it (never skip it), so the host memory held is one copy of each rank's shards.  A process killed while
a save is in flight leaves the temporary folder, which the next save removes, and the previous
checkpoint stays the latest.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from rlforge.trainer import checkpoint as ckpt


@dataclass
class Role:
    """One trained role to save: its engine and whether its save may overlap the next steps."""

    engine: Any
    async_save: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    """Entries added to a full-format state (a LoRA adapter's settings, ``lora``, for ``rlforge export``)."""


def _gather(value: Any) -> list[Any]:
    """Every rank's ``value`` (``[value]`` without a process group of several ranks)."""
    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


@dataclass
class _InFlight:
    """An asynchronous save: this rank's DCP futures; on rank 0, the thread that commits after them."""

    futures: list[Any]
    committer: threading.Thread | None = None
    error: list[BaseException] = field(default_factory=list)


class Checkpointer:
    """Writes checkpoints; one per trainer.  Every rank calls :meth:`save` and :meth:`wait` together.

    Args:
        rank: this process's rank (0 writes the files besides the shards and commits).
        on_commit: called on rank 0 with the checkpoint folder once it is the latest (for a log line).
    """

    def __init__(self, rank: int, on_commit: Callable[[Path], None] | None = None) -> None:
        self.rank = rank
        self.on_commit = on_commit
        self._in_flight: _InFlight | None = None
        self._group: Any = None
        self._stager: DefaultStager | None = None

    def _async_kwargs(self) -> dict[str, Any]:
        """A gloo group of its own for the background thread's collectives (created on first use, on
        every rank), and one stager reused across saves (pinned host buffers on CUDA)."""
        if self._group is None:
            self._group = dist.new_group(backend="gloo")
            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                        use_async_staging=False, use_non_blocking_copy=False))
        return {"process_group": self._group, "async_stager": self._stager}

    def save(self, root: str | Path, step: int, roles: dict[str, Role], trainer_state: dict[str, Any], *,
             config: str | None = None, exports: dict[str, Callable[[Path], None]] | None = None,
             max_to_keep: int | None = None) -> None:
        """Save ``global_step_{step}`` under ``root`` (a collective).  Returns when every synchronous part
        is written and the asynchronous ones are staged; a save still in flight is waited for first.

        ``trainer_state`` (rank 0's; ``rng_per_rank`` is added here) goes to ``trainer_state.pt``."""
        self.wait()
        tmp = _gather(str(ckpt.new_tmp(root, step)) if self.rank == 0 else None)[0]
        tmp = Path(tmp)
        futures: list[Any] = []
        try:
            for name, role in roles.items():
                self._save_role(tmp / name, role, futures)
            per_rank = _gather(ckpt.rng_state())
            if self.rank == 0:
                ckpt.write_files(tmp, {"trainer_state": {**trainer_state, "rng_per_rank": per_rank}}, config, exports)
        except BaseException:
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if not futures:
            if self.rank == 0:
                self._commit(tmp, step, max_to_keep)
            _gather(None)  # a barrier: the checkpoint is the latest on every rank's return
            return
        self._in_flight = _InFlight(futures)
        if self.rank == 0:
            flight = self._in_flight
            flight.committer = threading.Thread(target=self._commit_after, args=(flight, tmp, step, max_to_keep),
                                                name="rlforge-checkpoint-commit", daemon=True)
            flight.committer.start()

    def _save_role(self, folder: Path, role: Role, futures: list[Any]) -> None:
        with role.engine.sharded_state() as state:
            if state is None:  # the full format: gathered on rank 0
                full = {**role.engine.state_dict(), **role.extra}
                if self.rank == 0:
                    folder.mkdir(exist_ok=True)
                    torch.save(full, folder / "state.pt")
            elif role.async_save:
                futures.append(dcp.async_save(state, checkpoint_id=str(folder), **self._async_kwargs()))
            else:
                dcp.save(state, checkpoint_id=str(folder))

    def _commit(self, tmp: Path, step: int, max_to_keep: int | None) -> None:
        final = ckpt.commit(tmp, step, max_to_keep)
        if self.on_commit is not None:
            self.on_commit(final)

    def _commit_after(self, flight: _InFlight, tmp: Path, step: int, max_to_keep: int | None) -> None:
        try:
            for f in flight.futures:
                f.result()
            self._commit(tmp, step, max_to_keep)
        except BaseException as e:  # noqa: BLE001 - re-raised by wait() on the training thread
            shutil.rmtree(tmp, ignore_errors=True)
            flight.error.append(e)

    @property
    def in_flight(self) -> bool:
        """True while an asynchronous save has not been waited for."""
        return self._in_flight is not None

    def wait(self) -> None:
        """Block until the save in flight (if any) is written and, on rank 0, committed.

        Raises:
            whatever the background save or commit raised (the checkpoint is then not committed)."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        errors: list[BaseException] = []
        for f in flight.futures:
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001
                errors.append(e)
        if flight.committer is not None:
            flight.committer.join()
            errors += flight.error
        if errors:
            raise errors[0]

    def close(self) -> None:
        """Wait for the save in flight, then free the staging buffers."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None

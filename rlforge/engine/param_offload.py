"""Parameters in host memory between phases: verl's ``fsdp_config.param_offload``.

verl's FSDP workers (FSDP1 and FSDP2 alike) move a role's parameters to the CPU after each phase
(rollout weight sync, log-prob pass, update) and back to the GPU before the next one; inside a
phase the engine runs exactly as without offload, so gradient accumulation, the optimizer and
the collectives are untouched (this is not FSDP's ``CPUOffload``, which runs the step on the CPU
and, under FSDP1, keeps only the last micro-batch's gradient: ``offload_policy`` still selects that).

:class:`ParamOffload` does the moves; the engine enters :meth:`ParamOffload.phase` around each of
its public calls (reentrant: the actor's update wraps all its mini-batches in one phase, so the
weights move once per update, not once per optimizer step).  What moves:

* FSDP2 (and an unsharded module): every parameter and buffer, through ``nn.Module._apply``;
  FSDP2's own ``_apply`` re-registers its sharded parameters (``FSDPParam.reset_sharded_param``),
  and DTensor parameters are swapped in place, so the optimizer keeps the same objects.
* FSDP1: each unit's ``FlatParameter`` (its local shard), through FSDP's
  ``FlatParamHandle.flat_param_to``, which re-points the original parameters' views at it
  (``use_orig_params=True``); ``_local_shard`` is re-pointed too, as verl does.

Moves copy (``Tensor.to(..., copy=True)``), so a CPU-to-CPU round trip is real: the CPU tests see
new storage after each move and bit-identical results.  Gradients are None between phases
(the engines zero them with ``set_to_none``); optimizer state is ``optimizer_offload``'s job
(:mod:`rlforge.engine.optim_offload`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

Mover = Callable[[torch.device], None]
"""Moves a module's parameters to the given device (in place, keeping the parameter objects)."""


def module_mover(module: nn.Module) -> Mover:
    """The mover of an FSDP2 or unsharded module: ``_apply`` with a copying ``.to``."""

    @torch.no_grad()
    def move(dest: torch.device) -> None:
        module._apply(lambda t: t.to(dest, copy=True))

    return move


def fsdp1_mover(root: nn.Module) -> Mover:
    """The mover of an FSDP1 root: every unit's flat parameter (its local shard)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    @torch.no_grad()
    def move(dest: torch.device) -> None:
        for unit in FullyShardedDataParallel.fsdp_modules(root):
            handle = getattr(unit, "_handle", None)
            if handle is None:
                continue
            handle.flat_param_to(dest, copy=True)
            if hasattr(handle.flat_param, "_local_shard"):
                handle.flat_param._local_shard = handle.flat_param.data

    return move


class ParamOffload:
    """Keeps a module's parameters on ``host`` between phases and on ``device`` inside them.

    Args:
        mover: moves the parameters (:func:`module_mover`, :func:`fsdp1_mover`).
        device: the compute device.
        host: where the parameters wait (the CPU).

    Use :meth:`phase` around work that needs the parameters; call :meth:`offload` once after
    construction.
    """

    def __init__(self, mover: Mover, device: torch.device, host: torch.device | str = "cpu") -> None:
        self.mover = mover
        self.device = torch.device(device)
        self.host = torch.device(host)
        self.depth = 0
        """Nesting depth of :meth:`phase` (0 = between phases)."""
        self.offloaded = False
        """True while the parameters are on :attr:`host`."""
        self.moves = 0
        """Moves done so far (each direction counts one)."""

    def offload(self) -> None:
        """Parameters to the host (no-op when already there)."""
        if not self.offloaded:
            self.mover(self.host)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            self.offloaded, self.moves = True, self.moves + 1

    def load(self) -> None:
        """Parameters to the device (no-op when already there)."""
        if self.offloaded:
            self.mover(self.device)
            self.offloaded, self.moves = False, self.moves + 1

    @contextmanager
    def phase(self) -> Iterator[None]:
        """Context: the parameters on the device inside, back on the host when the outermost
        phase ends (also on an exception)."""
        if self.depth == 0:
            self.load()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0:
                self.offload()

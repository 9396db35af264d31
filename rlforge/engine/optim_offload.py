"""Optimizer state in host memory between steps, streamed through the device for the step.

``fsdp_config.optimizer_offload`` (and ``megatron.optimizer_offload``) without parameter
offload.  The AdamW moments (``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``: 2–3 × the fp32
shard bytes, 61 GB for a 7.6B-parameter model) live in host buffers, pinned on CUDA, between
steps.  :meth:`OffloadedOptimizer.step` walks the parameters in chunks of about
``chunk_bytes`` of state: it copies one chunk's moments to the device, runs the optimizer on
that chunk alone (the other parameters' gradients are set aside, and ``torch.optim``
skips parameters without a gradient), copies the moments back into their host buffers and
frees the chunk's gradients.  The device therefore holds one chunk of optimizer state at a
time instead of all of it, for ``2 × state bytes`` of host-device traffic per step.  The
``step`` counters stay where the optimizer keeps them (on the device for fused AdamW).

Parameters may be DTensors (FSDP2): the state's local tensors are swapped, the DTensor's
mesh, placements and global shape are kept.  On a CPU device the host buffers are the state
itself (no copy), so the same code runs in the CPU tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.tensor import DTensor

STATE_KEYS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
"""Optimizer-state entries that are offloaded (per-parameter tensors of the parameter's shape)."""


def local_of(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor, or ``t`` itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def with_local(like: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` wrapped as ``like`` is: the same DTensor spec (mesh, placements, global shape)
    around the new local tensor, kept on ``local``'s device, or ``local`` itself for a plain tensor.

    Not ``DTensor.from_local``: that moves a CPU local tensor to the mesh's device type, so
    host-resident state would silently go back to the GPU (found on an H200: the 7B run's
    second optimizer step ran out of memory with all 61 GB of "offloaded" moments on the GPU).
    The DTensor constructor keeps the local tensor as it is, as FSDP2's own CPU offload does."""
    if not isinstance(like, DTensor):
        return local
    return DTensor(local, like._spec, requires_grad=False)  # type: ignore[call-arg]


class OffloadedOptimizer:
    """Host-resident optimizer state for ``optimizer`` on ``device`` (see the module docstring).

    Args:
        optimizer: a ``torch.optim`` optimizer whose per-parameter state holds :data:`STATE_KEYS`.
        device: the compute device of the parameters.
        chunk_bytes: optimizer-state bytes brought to the device at once (default 1 GiB).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, device: torch.device, chunk_bytes: int = 1 << 30) -> None:
        self.optimizer = optimizer
        self.device = device
        self.chunk_bytes = int(chunk_bytes)
        self.host: dict[tuple[int, str], torch.Tensor] = {}
        """``(id(param), key)`` → the host buffer of that state entry (local shard)."""

    # ------------------------------------------------------------------ moves
    def _to_host(self, p: torch.Tensor) -> None:
        state = self.optimizer.state.get(p)
        if not state:
            return
        for k in STATE_KEYS:
            v = state.get(k)
            if not isinstance(v, torch.Tensor):
                continue
            loc = local_of(v)
            buf = self.host.get((id(p), k))
            if buf is None:
                if loc.device.type == "cpu":
                    buf = loc  # already host memory: it becomes the buffer
                else:
                    buf = torch.empty(loc.shape, dtype=loc.dtype, pin_memory=True)
                self.host[(id(p), k)] = buf
            if buf is not loc:
                buf.copy_(loc, non_blocking=True)
            state[k] = with_local(v, buf)

    def _to_device(self, p: torch.Tensor) -> None:
        state = self.optimizer.state.get(p)
        if not state:
            return
        for k in STATE_KEYS:
            v = state.get(k)
            if isinstance(v, torch.Tensor):
                state[k] = with_local(v, local_of(v).to(self.device, non_blocking=True))

    def _params(self) -> list[torch.Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # host buffers complete before CPU reads

    def offload_all(self) -> None:
        """Move every parameter's state to its host buffer (e.g. after loading a checkpoint)."""
        for p in self._params():
            self._to_host(p)
        self._sync()

    @contextmanager
    def all_on_device(self) -> Iterator[None]:
        """Context: the whole state on the device (state-dict save and load), back to host after."""
        for p in self._params():
            self._to_device(p)
        try:
            yield
        finally:
            self.offload_all()

    def is_offloaded(self) -> bool:
        """True when every state entry that exists lives in its host buffer (the same memory)."""
        for p in self._params():
            state = self.optimizer.state.get(p) or {}
            for k in STATE_KEYS:
                v = state.get(k)
                buf = self.host.get((id(p), k))
                if isinstance(v, torch.Tensor) and (buf is None or local_of(v).data_ptr() != buf.data_ptr()):
                    return False
        return True

    # ------------------------------------------------------------------ step
    def _chunks(self, params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
        out: list[list[torch.Tensor]] = [[]]
        size = 0
        for p in params:
            b = 2 * local_of(p).numel() * 4  # two fp32 moments
            if out[-1] and size + b > self.chunk_bytes:
                out.append([])
                size = 0
            out[-1].append(p)
            size += b
        return out

    def step(self) -> None:
        """One optimizer step over every parameter with a gradient, a chunk at a time; the
        gradients are released (set to None) as their chunk is done."""
        params = [p for p in self._params() if p.grad is not None]
        grads = {id(p): p.grad for p in params}
        for p in params:
            p.grad = None
        for chunk in self._chunks(params):
            for p in chunk:
                p.grad = grads.pop(id(p))
                self._to_device(p)
            self.optimizer.step()
            for p in chunk:
                self._to_host(p)
                p.grad = None
        self._sync()

"""CUDA graphs of the pure decode step (:meth:`ModelRunner.decode`) for a set of batch sizes.

A decode step of a small model is hundreds of short kernels; launching them one by one from
Python costs more than running them.  Each size, captured the first time a batch needs it, replays the whole step (embedding,
every layer with its KV write and paged attention, final norm, LM head) with one launch.
All graphs share one memory pool and read fixed input buffers; a batch of ``B`` rows runs in
the smallest captured size ``>= B``, the extra rows padded with context length 0 and a KV
slot in a spare block that no sequence owns (``trash_slot``), so padding never touches real
cache entries.  The logits land in one shared ``[max_size, V]`` buffer in the compute dtype.

The graphs record the addresses of the module's weights and of the KV cache: weights
updated in place (the optimizer's step, ``engine.sync_to``) are seen at the next replay;
a new cache or new weight tensors need a new capture (the engine compares :func:`weights_key`).

The warm-up before capture runs on one side stream per device, kept for the process
(:func:`warmup_stream`): PyTorch keeps a cuBLAS workspace (tens of MB on Hopper) for every
(handle, stream) pair it has seen and never frees it, so a new stream per generation kept one
more workspace per training step (the ~35 MB/step growth of allocated memory seen in every e2e
run), until its pool of 32 streams per priority came round again (about 1 GB).
"""

from __future__ import annotations

import time

import torch

from rlforge.rollout.native.model_runner import DecodeInputs, ModelRunner

DEFAULT_CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 320, 384, 448, 512, 640, 768, 896, 1024)


_WARMUP_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def warmup_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream that :class:`DecodeGraphs` warms up on for CUDA ``device`` (see the
    module docstring: a new stream each time would leak a cuBLAS workspace each time)."""
    dev = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
    stream = _WARMUP_STREAMS.get(dev)
    if stream is None:
        stream = _WARMUP_STREAMS[dev] = torch.cuda.Stream(dev)
    return stream


def capture_sizes(requested: list[int] | None, max_batch: int) -> list[int]:
    """Sizes to capture: ``requested`` (``rollout.cudagraph_capture_sizes``) or the default
    ladder, cut at ``max_batch``, and always including ``max_batch`` so every batch fits."""
    base = sorted({int(s) for s in (requested or DEFAULT_CAPTURE_SIZES) if 0 < int(s) <= max_batch})
    if not base or base[-1] < max_batch:
        base.append(max_batch)
    return base


def weights_key(module: torch.nn.Module) -> tuple[int, ...]:
    """Identities and storage addresses of the module's parameters: changes when the weights are
    new tensors (or new Parameter objects over the same storage)."""
    return tuple(x for p in module.parameters() for x in (id(p), p.data_ptr()))


class DecodeGraphs:
    """Captured decode steps; see the module docstring.

    Args:
        runner: the model runner (its cache must have a spare block holding ``trash_slot``).
        sizes: batch sizes to capture (ascending).
        max_blocks: width of the block-table buffer (blocks per sequence at full length).
        trash_slot: flat KV slot written by padding rows.
    """

    def __init__(self, runner: ModelRunner, sizes: list[int], max_blocks: int, trash_slot: int) -> None:
        dev = runner.cache.data.device
        n = sizes[-1]
        self.sizes = sizes
        self.trash_slot = trash_slot
        self.max_blocks = max_blocks
        self.buf = DecodeInputs(
            torch.zeros(n, dtype=torch.long, device=dev), torch.zeros(n, dtype=torch.long, device=dev),
            torch.full((n,), trash_slot, dtype=torch.long, device=dev),
            torch.zeros((n, max_blocks), dtype=torch.int32, device=dev), torch.zeros(n, dtype=torch.int32, device=dev),
        )
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        side = warmup_stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up: Triton compile, cuBLAS workspaces; learns the logits dtype
            for _ in range(2):
                out = runner.decode(self.view(n))
        torch.cuda.current_stream(dev).wait_stream(side)
        self.logits = torch.empty_like(out)
        del out
        self._runner = runner
        self._pool = None
        self.capture_s = 0.0

    def _capture(self, size: int) -> torch.cuda.CUDAGraph:
        """Capture the decode step of ``size`` rows (on first use: a generation whose batch
        never shrinks captures one size, not the whole ladder).  All sizes share one memory
        pool; they never run concurrently and none keeps a live tensor in it (the LM head writes
        the logits straight into :attr:`logits`, outside the pool), so the order of capture does
        not matter."""
        t0 = time.perf_counter()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self._pool):
            self._runner.decode(self.view(size), out=self.logits[:size])
        self._pool = g.pool()
        self.graphs[size] = g
        self.capture_s += time.perf_counter() - t0
        return g

    def bucket(self, batch: int) -> int | None:
        """Smallest captured size ``>= batch``; None when the batch is larger than all."""
        return next((s for s in self.sizes if s >= batch), None)

    def view(self, size: int) -> DecodeInputs:
        """The first ``size`` rows of the input buffers (what a graph of that size reads)."""
        b = self.buf
        return DecodeInputs(b.input_ids[:size], b.positions[:size], b.slot_mapping[:size], b.block_tables[:size],
                            b.context_lens[:size])

    def reset_padding(self, batch: int, size: int) -> None:
        """Rows ``[batch, size)`` become padding: no context, KV written to the spare slot."""
        self.buf.context_lens[batch:size] = 0
        self.buf.slot_mapping[batch:size] = self.trash_slot
        self.buf.input_ids[batch:size] = 0
        self.buf.positions[batch:size] = 0

    def replay(self, size: int) -> torch.Tensor:
        """Run the graph of ``size`` (captured now if new) on the current buffers; returns ``logits[:size]``."""
        g = self.graphs.get(size) or self._capture(size)
        g.replay()
        return self.logits[:size]

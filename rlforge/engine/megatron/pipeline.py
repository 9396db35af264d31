"""Running the stages of one rank over micro-batches: directly (``pp = 1``) or as a pipeline.

Training with ``pp > 1`` uses ``torch.distributed.pipelining``: one :class:`TimedStage` (a
``PipelineStage`` that times its own compute) per local stage, and ``Schedule1F1B``
(Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", section 2.2.1) or, with virtual stages, ``ScheduleInterleaved1F1B``
(section 2.2.2).  The stages are built with static shapes (no metadata inference), so
every micro-batch of one schedule step has the same shape; :class:`MicroInputs` are padded
to that shape by the engine.  The last schedule is kept while ``(rows, seq, count)`` repeats
(its stages hold receive buffers for every micro-batch, so no more than one is kept).

The loss runs on the last stage through the schedule's ``loss_fn(output, target)``; the
target of micro-batch ``i`` is the tensor ``[i]``, and the engine's callback (held by the
runner for the step: torch 2.11's ``step`` has no ``loss_kwargs``) looks the micro-batch up, so the loss sees the micro-batch's own data
(response mask, advantages, old log-probs) and the mini-batch :class:`LossScale`.

Forward-only passes (log-probs, values) use a plain fill-drain loop instead of a schedule:
each micro-batch's activations are sent on (``isend``) as soon as they are computed, and the
last stage turns each micro-batch's logits into log-probs at once, so only one micro-batch of
logits is alive (torch's schedules keep every chunk's output until the step ends).

Bubble.  Each rank measures the wall time of the schedule step and the time its stages spend
computing (forward, backward, loss; CUDA events on the GPU).  ``1 - compute / wall`` is the
fraction of the step the rank waits for its neighbours: the pipeline bubble (plus exposed
communication).  The ideal 1F1B value is ``(p - 1) / (m + p - 1)`` for ``p`` stages and ``m``
micro-batches (Narayanan et al., eq. 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

LossCallback = Callable[[int, torch.Tensor], torch.Tensor]
"""``(micro-batch index, last stage output) -> loss`` (the engine's)."""
OutputCallback = Callable[[int, torch.Tensor], None]
"""``(micro-batch index, last stage output) -> None`` (forward-only passes)."""


@dataclass
class MicroInputs:
    """Model inputs of one micro-batch on the device, ``(rows, seq)`` each, possibly padded."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.input_ids.shape[0]), int(self.input_ids.shape[1])


class ComputeTimer:
    """Sums the durations of compute sections; CUDA events on the GPU (read at :meth:`total_s`)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.cpu_s = 0.0
        self.events: list[tuple[Any, Any]] = []

    def section(self) -> _Section:
        return _Section(self)

    def total_s(self) -> float:
        """Seconds measured so far (synchronises with the GPU)."""
        if self.cuda and self.events:
            torch.cuda.synchronize()
            self.cpu_s += sum(a.elapsed_time(b) for a, b in self.events) / 1e3
            self.events.clear()
        return self.cpu_s


class _Section:
    def __init__(self, timer: ComputeTimer) -> None:
        self.timer = timer

    def __enter__(self) -> None:
        if self.timer.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.t0 = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        if self.timer.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.timer.events.append((self.start, end))
        else:
            self.timer.cpu_s += time.perf_counter() - self.t0


class TimedStage(PipelineStage):
    """A ``PipelineStage`` that adds the time of each forward and backward chunk to ``timer``."""

    def __init__(self, *args: Any, timer: ComputeTimer, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timer = timer

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        with self.timer.section():
            return super().forward_one_chunk(*args, **kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        with self.timer.section():
            return super().backward_one_chunk(*args, **kwargs)


class DirectRunner:
    """``pp = 1``: the one stage runs each micro-batch in turn (forward, loss, backward)."""

    def __init__(self, stage: nn.Module) -> None:
        self.stage = stage
        self.last_bubble = 0.0

    def train(self, micros: list[MicroInputs], loss_cb: LossCallback) -> None:
        for i, mi in enumerate(micros):
            out = self.stage(mi.input_ids, mi.attention_mask, mi.position_ids)
            loss_cb(i, out).backward()

    def infer(self, micros: list[MicroInputs], out_cb: OutputCallback) -> None:
        for i, mi in enumerate(micros):
            out_cb(i, self.stage(mi.input_ids, mi.attention_mask, mi.position_ids))


@dataclass(frozen=True)
class StageShapes:
    """What flows between stages: ``hidden`` ``(rows, seq_local, hidden_size)`` in ``act_dtype``
    and, from the last stage, ``(rows, seq, out_width)`` in ``out_dtype``."""

    hidden_size: int
    seq_divisor: int
    act_dtype: torch.dtype
    out_width: int
    out_dtype: torch.dtype

    def hidden(self, rows: int, seq: int, grad: bool = False) -> torch.Tensor:
        return torch.empty((rows, seq // self.seq_divisor, self.hidden_size), dtype=self.act_dtype, device="meta",
                           requires_grad=grad)


class PipelineRunner:
    """``pp > 1``: this rank's stages (``stage_ids[k]`` holds ``stages[k]``) in a pipeline of
    ``num_stages`` over ``pp_group`` (``pp_ranks``: global ranks by pipeline index)."""

    def __init__(self, stages: list[nn.Module], stage_ids: list[int], num_stages: int, pp_group: Any,
                 pp_ranks: list[int], device: torch.device, shapes: StageShapes) -> None:
        self.stages, self.stage_ids, self.num_stages = stages, stage_ids, num_stages
        self.pp_group, self.pp_ranks, self.device, self.shapes = pp_group, pp_ranks, device, shapes
        self.interleaved = len(stages) > 1
        self._cache: dict[tuple[int, int, int], tuple[Any, ComputeTimer]] = {}
        self.last_bubble = 0.0
        self._loss_cb: LossCallback | None = None  # the running step's loss callback

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The schedules' ``loss_fn(output, target)``: ``target`` holds the micro-batch index."""
        assert self._loss_cb is not None, "loss outside PipelineRunner.train"
        return self._loss_cb(int(target.reshape(-1)[0]), output)

    # ------------------------------------------------------------------ training
    def min_micro_batches(self, n: int) -> int:
        """The smallest count ``>= n`` the schedule accepts (1F1B: at least one per rank;
        interleaved: a multiple of the number of rounds)."""
        pp = len(self.pp_ranks)
        n = max(n, pp)
        if self.interleaved:
            while n % max(1, n // pp):
                n += 1
        return n

    def _schedule(self, rows: int, seq: int, n: int) -> tuple[Any, ComputeTimer]:
        key = (rows, seq, n)
        if key in self._cache:
            return self._cache[key]
        self._cache.clear()  # a schedule's stages hold receive buffers for all its micro-batches
        timer = ComputeTimer(self.device)
        pipe_stages = []
        for sid, mod in zip(self.stage_ids, self.stages, strict=True):
            first, last = sid == 0, sid == self.num_stages - 1
            inp = torch.empty((rows, seq), dtype=torch.long, device="meta") if first else \
                self.shapes.hidden(rows, seq, grad=True)
            out = torch.empty((rows, seq, self.shapes.out_width), dtype=self.shapes.out_dtype, device="meta") \
                if last else self.shapes.hidden(rows, seq, grad=True)
            pipe_stages.append(TimedStage(mod, sid, self.num_stages, self.device, input_args=(inp,),
                                          output_args=(out,), group=self.pp_group, timer=timer))
        if self.interleaved:
            sched = ScheduleInterleaved1F1B(pipe_stages, n, loss_fn=self._loss, scale_grads=False)
        else:
            sched = Schedule1F1B(pipe_stages[0], n, loss_fn=self._loss, scale_grads=False)
        self._cache[key] = (sched, timer)
        return sched, timer

    def train(self, micros: list[MicroInputs], loss_cb: LossCallback) -> None:
        """One schedule step over ``micros`` (all of one shape; ``len(micros)`` from
        :meth:`min_micro_batches`).  Sets :attr:`last_bubble`."""
        rows, seq = micros[0].shape
        sched, timer = self._schedule(rows, seq, len(micros))
        timer.total_s()
        timer.cpu_s = 0.0

        def timed_loss(i: int, out: torch.Tensor) -> torch.Tensor:
            with timer.section():
                return loss_cb(i, out)

        args = (torch.cat([m.input_ids for m in micros]),) if 0 in self.stage_ids else ()
        kwargs = {"attention_mask": torch.cat([m.attention_mask for m in micros]),
                  "position_ids": torch.cat([m.position_ids for m in micros])}
        target = torch.arange(len(micros))  # on the CPU: reading the index costs no device sync
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        self._loss_cb = timed_loss
        try:
            sched.step(*args, target=target, return_outputs=False, **kwargs)
        finally:
            self._loss_cb = None
        busy = timer.total_s()
        wall = time.perf_counter() - t0
        self.last_bubble = max(0.0, 1.0 - busy / wall) if wall > 0 else 0.0

    # ------------------------------------------------------------------ forward only
    def infer(self, micros: list[MicroInputs], out_cb: OutputCallback) -> None:
        """Fill-drain forward of every micro-batch (shapes may differ between micro-batches)."""
        pending: list[Any] = []
        pp = len(self.pp_ranks)
        for i, mi in enumerate(micros):
            rows, seq = mi.shape
            for sid, mod in zip(self.stage_ids, self.stages, strict=True):
                if sid == 0:
                    x = mi.input_ids
                else:
                    x = torch.empty(self.shapes.hidden(rows, seq).shape, dtype=self.shapes.act_dtype, device=self.device)
                    dist.recv(x, src=self.pp_ranks[(sid - 1) % pp], group=self.pp_group)
                out = mod(x, mi.attention_mask, mi.position_ids)
                if sid == self.num_stages - 1:
                    out_cb(i, out)
                else:
                    out = out.contiguous()
                    pending.append((dist.isend(out, dst=self.pp_ranks[(sid + 1) % pp], group=self.pp_group), out))
                    while len(pending) > 2 * pp:  # bound the activations kept alive by unfinished sends
                        pending.pop(0)[0].wait()
        for work, _ in pending:
            work.wait()

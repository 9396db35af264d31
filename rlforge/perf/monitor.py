"""Per-rank performance recording for the trainer: the stage timeline, the GPU sampler,
the trace files and ``torch.profiler`` steps, owned by one :class:`PerfMonitor`.

Files under ``<trainer.default_local_dir>/trace/`` (``R`` = rank):

- ``rank<R>.json``: the Chrome / Perfetto trace of every stage (``trainer.profile=true``),
  rewritten at most every :attr:`PerfMonitor.TRACE_WRITE_EVERY_S` seconds and at the end;
- ``gpu_samples_rank<R>.jsonl``: every GPU sample (``trainer.profile=true`` on a GPU);
- ``torch_rank<R>_step<N>.json``: a ``torch.profiler`` trace of each step N in ``trainer.profile_steps``
  (and in verl's ``global_profiler.steps`` with ``global_profiler.tool=torch``; these files go to
  ``global_profiler.save_path`` where that is set: :mod:`rlforge.perf.verl_profiler`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from rlforge.perf.gpu_sampler import GpuSample, GpuSampler, gpu_step_metrics, local_gpu_reader, util_stats
from rlforge.perf.trace import Timeline, chrome_trace, sample_rows, write_json_atomic
from rlforge.perf.verl_profiler import torch_profile


class PerfMonitor:
    """Records stages and GPU samples of one rank and turns them into metrics and files.

    Args:
        timeline: the stage recorder passed to every ``timed(...)`` block.
        sampler: the GPU sampler, or None (no GPU: the GPU metrics are absent).
        trace_dir: ``<run dir>/trace``.
        profile: write the stage trace and the GPU samples file.
        profile_steps: steps recorded with ``torch.profiler``.
        torch_trace_dir: folder of the ``torch.profiler`` files; None = ``trace_dir``.
    """

    TRACE_WRITE_EVERY_S = 60.0

    def __init__(self, timeline: Timeline, sampler: GpuSampler | None, trace_dir: Path, profile: bool = False,
                 profile_steps: tuple[int, ...] = (), torch_trace_dir: Path | None = None) -> None:
        self.timeline = timeline
        self.sampler = sampler
        self.trace_dir = Path(trace_dir)
        self.torch_trace_dir = Path(torch_trace_dir) if torch_trace_dir is not None else self.trace_dir
        self.profile = profile
        self.profile_steps = frozenset(profile_steps)
        self._kept_samples: list[GpuSample] = []  # for the trace's counter tracks (profile only)
        self._samples_written_to = -float("inf")
        self._last_trace_write = -float("inf")
        self._samples_file_started = False  # this session's first write truncates an earlier session's file
        self._cpu_mark = (time.perf_counter(), sampler.cpu_time_s() if sampler else 0.0)
        if sampler is not None:
            sampler.start()

    @classmethod
    def from_config(cls, trainer_cfg: Any, rank: int, device: torch.device, out_dir: str | Path,
                    global_profiler: Mapping[str, Any] | None = None) -> PerfMonitor:
        """Build from ``trainer.{profile,profile_steps,gpu_sample_interval_s}`` and verl's ``global_profiler``
        (:func:`~rlforge.perf.verl_profiler.torch_profile`: its steps join ``profile_steps``); samples
        ``device`` if it is a GPU.

        Raises:
            ConfigError: bad ``global_profiler.steps``.
        """
        verl = torch_profile(global_profiler or {})
        sampler = None
        interval = float(trainer_cfg.gpu_sample_interval_s)
        if interval > 0:
            index = device.index if device.index is not None else (torch.cuda.current_device()
                                                                   if device.type == "cuda" else 0)
            read = local_gpu_reader(device.type, [index])
            sampler = GpuSampler(read, interval) if read is not None else None
        steps = tuple(sorted({int(s) for s in (trainer_cfg.profile_steps or ())} | set(verl.steps)))
        return cls(Timeline(rank), sampler, Path(out_dir) / "trace", bool(trainer_cfg.profile), steps,
                   Path(verl.save_path) if verl.save_path is not None else None)

    # ------------------------------------------------------------------ during a step
    @contextmanager
    def step(self, global_step: int) -> Iterator[None]:
        """Wrap one training step: tags the recorded stages with ``global_step`` and, for the
        steps in ``profile_steps``, records it with ``torch.profiler``."""
        self.timeline.step = global_step
        if global_step not in self.profile_steps:
            yield
            return
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        with profile(activities=acts) as prof:
            yield
        self.torch_trace_dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.torch_trace_dir / f"torch_rank{self.timeline.rank}_step{global_step}.json"))

    def step_metrics(self) -> dict[str, float]:
        """GPU metrics of the last ``step`` interval (see :func:`gpu_step_metrics`) and
        ``perf/gpu_sampler_overhead``: the sampler thread's CPU seconds per wall second since
        the previous call.  Empty without a sampler."""
        last = self.timeline.last("step")
        if self.sampler is None or last is None:
            return {}
        out = gpu_step_metrics(self.sampler.samples(last.start_s, last.end_s), (last.start_s, last.end_s),
                               self.timeline.stage_windows(last.step))
        now, cpu = time.perf_counter(), self.sampler.cpu_time_s()
        wall0, cpu0 = self._cpu_mark
        if now > wall0:
            out["perf/gpu_sampler_overhead"] = (cpu - cpu0) / (now - wall0)
        self._cpu_mark = (now, cpu)
        return out

    def stage_metrics(self, name: str) -> dict[str, float]:
        """``perf/gpu_util/<name>`` of the last interval of stage ``name`` (e.g. ``testing``),
        if a sample fell in it."""
        last = self.timeline.last(name)
        if self.sampler is None or last is None:
            return {}
        st = util_stats(self.sampler.samples(last.start_s, last.end_s), [(last.start_s, last.end_s)])
        return {} if st is None else {f"perf/gpu_util/{name}": st.util_mean}

    # ------------------------------------------------------------------ files
    def flush(self, final: bool = False) -> None:
        """End of a loop iteration: write the trace files (with ``profile``) and drop what is
        no longer needed, so memory stays bounded when not profiling."""
        now = time.perf_counter()
        new = self.sampler.samples(self._samples_written_to, now) if self.sampler else []
        new = [s for s in new if s.time_s > self._samples_written_to]
        if self.profile:
            self._kept_samples.extend(new)
            if new:
                self._append_samples(new)
            if final or now - self._last_trace_write >= self.TRACE_WRITE_EVERY_S:
                self.write_trace()
                self._last_trace_write = now
        else:
            self.timeline.clear()
        if new:
            self._samples_written_to = new[-1].time_s
        if self.sampler is not None:
            self.sampler.discard_before(now)

    def trace_path(self) -> Path:
        return self.trace_dir / f"rank{self.timeline.rank}.json"

    def write_trace(self) -> None:
        tl = self.timeline
        write_json_atomic(self.trace_path(), chrome_trace(tl.events, tl.rank, tl.offset_s, self._kept_samples))

    def _append_samples(self, samples: list[GpuSample]) -> None:
        path = self.trace_dir / f"gpu_samples_rank{self.timeline.rank}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a" if self._samples_file_started else "w", encoding="utf-8") as fh:
            self._samples_file_started = True
            for row in sample_rows(samples, self.timeline.offset_s):
                fh.write(json.dumps(row) + "\n")

    def close(self) -> None:
        """Stop the sampler and write the last trace."""
        if self.sampler is not None:
            self.sampler.stop()
        self.flush(final=True)

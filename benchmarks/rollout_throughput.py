"""Rollout throughput: rlforge's native engine against transformers at its best, same run, same GPU.

    python benchmarks/rollout_throughput.py --models qwen2.5-0.5b qwen2.5-7b
    python benchmarks/rollout_throughput.py --kernels      # decode kernels and decode steps vs their floors

Workloads (random-weight ``preset:`` models in bf16, sampling at T = 1, no top-k/top-p):
  random    ``--prompts`` (1024) prompts of 256 random tokens, ``--new-tokens`` (512) new tokens each, EOS off;
  longtail  ``--longtail-prompts`` (512) prompts of 256 tokens whose response lengths are long-tailed
            (``benchmarks/longtail.py``: clipped lognormal, ``--longtail-mean`` 500, ``--longtail-p99``
            3000, ``--longtail-max`` 4096), enforced per row (native and continuous batching: per-row
            ``max_new_tokens``; ``generate``: a forced EOS at each row's length, see ``hf_baselines.py``);
  grpo      ``--groups`` (128) prompts x n=8 of the random workload's lengths, with and without prefix sharing.

transformers rows (``--hf-setups``, the registry in ``benchmarks/hf_baselines.py``; each at each
``--hf-batch`` size on the random workload, on the whole long-tail workload at once):
  generate         issue 17's plain call: ``model.generate(ids, max_new_tokens, min_new_tokens,
                   do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)``, no attention mask;
  generate-old     this benchmark's call before issue 17 (its 14.8k tok/s row): the same plus an all-ones
                   ``attention_mask`` and ``eos_token_id=None``; ``generate-mask`` / ``generate-noeos`` add one
                   of the two, so the table shows which one costs the time;
  static-compile   plain + ``cache_implementation="static"`` (the forward compiled by transformers);
  cb, cb-compile, cb-nographs, cb-noflash   transformers' continuous batching (``init_continuous_batching``
                   / ``generate_batch``): default config, ``default_compile_level=1``, no CUDA graphs, no
                   automatic switch to flash attention.
Tokens are the generated tokens counted per row.  A setup that fails prints a ``failed: reason`` row.

Native rows: Triton or torch decode attention, with and without CUDA graphs, with and without the
fused Triton layer kernels (``-unfused``) and packed GEMMs (``-unpacked``); ``-burstN`` runs up to
``N`` decode steps between two host reads (the engine's ``max_decode_burst``, default 64).

Columns: output tok/s; ``x best`` over the fastest transformers row of the same model and workload
(any setup), ``x best cb`` over the fastest continuous-batching row; the fraction of the combined
floor (``benchmarks/rollout_roofline.py``: each decode step at max(bytes / bandwidth, FLOPs / peak),
its bytes all weights once, the input embedding only when tied to the head, the gathered embedding
rows and every running sequence's K/V; prefill at the bf16 compute peak) over the device's spec
bandwidth (4.8 TB/s on an H200) and over the copy bandwidth measured in the same run;
``decode step frac``: the mean decode step's floor (spec bandwidth) over the mean measured decode
step (``rollout/decode_s`` less graph capture, over ``rollout/decode_steps``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_baselines import HF_SETUPS, run_setup  # noqa: E402
from longtail import LongTail, describe  # noqa: E402
from rollout_roofline import PEAK_BF16, ModelCost, run_floor, spec_bandwidth, step_floor  # noqa: E402

from rlforge.batch import Batch  # noqa: E402
from rlforge.models.presets import PRESETS  # noqa: E402
from rlforge.rollout import SamplingParams  # noqa: E402
from rlforge.rollout.native import NativeRollout  # noqa: E402

PROMPT_LEN = 256


@dataclass
class Row:
    model: str
    workload: str
    engine: str
    setting: str
    tokens: int = 0
    seconds: float = math.nan
    floor_spec_s: float = math.nan
    floor_copy_s: float = math.nan
    extra: str = ""
    decode_step_frac: float = math.nan
    failed: str = ""

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if not self.failed and self.seconds > 0 else math.nan


@dataclass
class Workload:
    """``name``; prompts ``[n, PROMPT_LEN]`` (``Batch`` with mask and positions); ``lengths: [n]`` new tokens."""

    name: str
    batch: Batch
    lengths: np.ndarray

    def head(self, n: int) -> Workload:
        return Workload(self.name, self.batch.select(slice(0, n)) if n < len(self.lengths) else self.batch,
                        self.lengths[:n])


def build(name: str) -> torch.nn.Module:
    cls, kw = PRESETS[name]
    cfg = cls(**kw)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return model.eval()


def prompts(n: int, vocab: int, seed: int, group: int = 1) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, vocab - 100, (n // group, PROMPT_LEN), generator=g).repeat_interleave(group, 0)
    mask = torch.ones_like(ids)
    return Batch.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1})


def measure_bandwidth() -> float:
    """Device-to-device copy bandwidth in bytes/s (bytes read + written), mean of 10 copies."""
    x = torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        y.copy_(x)
    torch.cuda.synchronize()
    return 2 * x.numel() * 10 / (time.perf_counter() - t)


class Bandwidths:
    """The device's spec bandwidth (NaN when its name is not in the table) and the measured copy bandwidth."""

    def __init__(self) -> None:
        self.name = torch.cuda.get_device_name()
        self.spec = spec_bandwidth(self.name)
        self.copy = measure_bandwidth()

    def line(self) -> str:
        spec = f"{self.spec / 1e12:.2f} TB/s" if math.isfinite(self.spec) else "unknown (fractions over spec are NaN)"
        return (f"device: {self.name}  spec bandwidth {spec}, measured copy bandwidth {self.copy / 1e12:.2f} TB/s, "
                f"bf16 peak {PEAK_BF16 / 1e12:.0f} TFLOP/s")


def floors(cost: ModelCost, lengths: np.ndarray, max_num_seqs: int, bw: Bandwidths):
    """Combined floors (spec, copy) of a run of ``lengths`` after PROMPT_LEN-token prompts."""
    p = np.full(len(lengths), PROMPT_LEN)
    return run_floor(cost, p, lengths, max_num_seqs, bw.spec), run_floor(cost, p, lengths, max_num_seqs, bw.copy)


@contextlib.contextmanager
def per_row_lengths(lengths: np.ndarray, made: list):
    """Inside: the native engine gives row ``i`` ``lengths[i]`` new tokens (its ``Sequence``s are
    made with them, and kept in ``made`` so their tokens can be counted).  A benchmark-only
    swap of the engine module's ``Sequence`` name; the engine takes one ``max_new_tokens`` per call."""
    import rlforge.rollout.native.engine as engine_module

    orig = engine_module.Sequence

    def make(seq_id: int, prompt_ids: list[int], max_new_tokens: int):
        s = orig(seq_id, prompt_ids, int(lengths[seq_id]))
        made.append(s)
        return s

    engine_module.Sequence = make
    try:
        yield
    finally:
        engine_module.Sequence = orig


MAX_NUM_BATCHED_TOKENS = [16384]  # the engine's token budget per step (--max-num-batched-tokens)


def native_engine(model, max_num_seqs: int, **kw) -> NativeRollout:
    return NativeRollout(model, [], 0, torch.device("cuda"), progress=False, max_num_seqs=max_num_seqs,
                         max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS[0], ignore_eos=True, seed=0, **kw)


def run_native(model, wl: Workload, max_num_seqs: int, engine: NativeRollout | None = None,
               **kw) -> tuple[int, float, dict[str, float]]:
    """One timed ``generate`` of ``wl``: on a new engine (its KV cache allocation and graph capture
    timed), or on ``engine`` (a warm one: built with ``free_cache_engine=False`` and used before)."""
    eng = engine if engine is not None else native_engine(model, max_num_seqs, **kw)
    params = SamplingParams(temperature=1.0, max_new_tokens=int(wl.lengths.max()))
    made: list = []
    with per_row_lengths(wl.lengths, made):
        torch.cuda.synchronize()
        t = time.perf_counter()
        eng.generate(wl.batch, params)
        torch.cuda.synchronize()
        sec = time.perf_counter() - t
    return sum(len(s.output_ids) for s in made), sec, eng.metrics()


def decode_step_frac(floor, m: dict[str, float]) -> float:
    """The mean decode step's floor over the mean measured decode step (graph capture left out)."""
    steps = m.get("rollout/decode_steps", 0.0)
    measured = m.get("rollout/decode_s", 0.0) - m.get("rollout/graph_capture_s", 0.0)
    if steps <= 0 or measured <= 0 or floor.decode_steps <= 0:
        return math.nan
    return (floor.decode_s / floor.decode_steps) / (measured / steps)


def phases(m: dict[str, float]) -> str:
    """Where a native run's time went, from the engine's ``rollout/`` metrics."""
    steps = max(m.get("rollout/decode_steps", 0.0), 1.0)
    return (f"wake {m['rollout/wake_s']:.2f}s, prefill steps {m['rollout/mixed_step_s']:.2f}s, decode "
            f"{m['rollout/decode_s']:.2f}s ({m['rollout/decode_s'] / steps * 1e3:.1f} ms/step, graph capture "
            f"{m['rollout/graph_capture_s']:.2f}s; {m.get('rollout/overlapped_bursts', 0.0):.0f} of "
            f"{m.get('rollout/decode_bursts', 0.0):.0f} bursts and {m.get('rollout/overlapped_mixed_steps', 0.0):.0f} mixed "
            f"steps overlapped), host {m['rollout/host_s']:.2f}s")


def attempt(row: Row, fn) -> Row:
    """Fill ``row`` from ``fn() -> (tokens, seconds, extra, decode_step_frac)``; any exception
    becomes ``row.failed`` (its last line), so one failing setup does not end the run."""
    try:
        row.tokens, row.seconds, row.extra, row.decode_step_frac = fn()
    except Exception as e:  # noqa: BLE001 - a failed row is reported, the next one runs
        msg = (str(e).strip().splitlines() or [""])[-1][:200]
        row.failed = f"{type(e).__name__}: {msg}"
        traceback.print_exc(limit=3)
    finally:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    print(row, flush=True)
    return row


def profile(model, wl: Workload, max_num_seqs: int, warm: bool = False) -> None:
    """Host (cProfile, top functions by own time) and device (torch.profiler, top kernels,
    longest GPU idle gaps) views of one native generate, to see where the time goes; ``warm``:
    on one engine kept across the runs (``free_cache_engine=False``), as the ``-warm`` rows."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    from rlforge.perf.torch_trace import render_markdown, summarize

    eng = native_engine(model, max_num_seqs, free_cache_engine=False) if warm else None
    run_native(model, wl, max_num_seqs, eng)  # warm-up
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        run_native(model, wl, max_num_seqs, eng)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70), flush=True)
    trace = "rollout_profile_trace.json"
    prof.export_chrome_trace(trace)
    print(render_markdown(summarize(trace, num_gaps=5, top_kernels=25, min_gap_ms=1.0)), flush=True)
    pr = cProfile.Profile()
    pr.enable()
    tokens, sec, m = run_native(model, wl, max_num_seqs, eng)
    pr.disable()
    print(f"profiled native: {tokens} tokens in {sec:.2f} s ({tokens / sec:,.0f} tok/s) {m}")
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)
    pstats.Stats(pr).sort_stats("cumulative").print_stats(25)


def cuda_time(fn, iters: int = 20, repeats: int = 5) -> float:
    """Median over ``repeats`` of the mean seconds of ``fn()`` over ``iters`` calls (CUDA events, after 3 warm-ups)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / iters)
    return float(np.median(times))


def _frac(nbytes: float, t: float, bw: float) -> str:
    return f"{nbytes / t / bw:.2f}" if math.isfinite(bw) and t > 0 else "–"


def _kernel_row(label: str, shape: str, fn, nbytes: float, bw: Bandwidths, floor_s: float | None = None) -> None:
    """One ``| kernel | shape | ms | GB/s | frac spec | frac copy | floor frac |`` row, or a failed one."""
    try:
        t = cuda_time(fn, 10)
    except Exception as e:  # noqa: BLE001
        print(f"| {label} | {shape} | failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]} |||||",
              flush=True)
        torch.cuda.empty_cache()
        return
    floor = f"{floor_s / t:.2f}" if floor_s is not None else "–"
    print(f"| {label} | {shape} | {t * 1e3:.3f} | {nbytes / t / 1e9:,.0f} | {_frac(nbytes, t, bw.spec)} | "
          f"{_frac(nbytes, t, bw.copy)} | {floor} |", flush=True)


def _paged_kv(b: int, ctx: int, kvh: int, d: int, bs: int = 16, min_bytes: float = 512e6):
    """Random bf16 K/V caches of ``b`` rows x ``ctx`` tokens behind shuffled block tables:
    enough copies that together they pass ``min_bytes`` (rotated, so the L2 holds none)."""
    nb = b * (-(-ctx // bs))
    one = 2 * nb * bs * kvh * d * 2
    sets = []
    for _ in range(max(1, math.ceil(min_bytes / one))):
        kc = torch.randn(nb, bs, kvh, d, device="cuda", dtype=torch.bfloat16)
        sets.append((kc, torch.randn_like(kc), torch.randperm(nb, device="cuda", dtype=torch.int32).view(b, -1)))
    cl = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    return sets, cl, 2 * b * ctx * kvh * d * 2


def _attention_rows(name: str, h: int, kvh: int, d: int, bw: Bandwidths, b: int, ctx: int, variants) -> None:
    from rlforge.rollout.native.attention import decode_attention_torch
    from rlforge.rollout.native.triton_attention import auto_num_splits, paged_decode_attention

    sets, cl, nbytes = _paged_kv(b, ctx, kvh, d)
    q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16)
    it = iter(range(10**9))

    def call(f, **kw):
        return lambda: f(q, *sets[next(it) % len(sets)], cl, d ** -0.5, **kw)

    shape = f"{name} B={b} ctx={ctx}"
    for label, kw in variants:
        if label == "torch":
            if b * ctx <= 1024 * 512:
                _kernel_row("decode attention torch", shape, call(decode_attention_torch), nbytes, bw)
            continue
        if kw.get("num_splits") == "auto":
            kw = {**kw, "num_splits": None}
            label = f"{label} (splits={auto_num_splits(b, kvh, sets[0][2].shape[1] * 16, q.device)})"
        _kernel_row(f"decode attention triton {label}", shape, call(paged_decode_attention, **kw), nbytes, bw)


def _captured_step(model, cache, b: int, ctx: int, bs: int, splits_patch=None):
    """A captured whole decode step (:class:`DecodeGraphs` of the model runner) at ``b`` rows of
    ``ctx`` cached tokens behind shuffled block tables, and the split choice it was captured
    with; ``splits_patch`` replaces :func:`auto_num_splits` for the capture (e.g. always 1)."""
    from unittest import mock

    import rlforge.rollout.native.triton_attention as ta
    from rlforge.rollout.native.cuda_graph import DecodeGraphs
    from rlforge.rollout.native.model_runner import ModelRunner

    per_row = -(-(ctx + 1) // bs)
    runner = ModelRunner(model, cache, "triton")
    with contextlib.ExitStack() as stack:
        if splits_patch:
            stack.enter_context(mock.patch.object(ta, "auto_num_splits", splits_patch))
        splits = ta.auto_num_splits(b, runner.spec.num_kv_heads, per_row * bs, torch.device("cuda"))
        graphs = DecodeGraphs(runner, [b], per_row, b * per_row * bs)
        buf = graphs.buf
        buf.block_tables[:b] = torch.randperm(b * per_row, device="cuda", dtype=torch.int32).view(b, per_row)
        buf.context_lens[:b] = ctx + 1  # the new token's K/V is written, then read with the context
        buf.positions[:b] = ctx
        page = buf.block_tables[:b, ctx // bs].long()
        buf.slot_mapping[:b] = page * bs + ctx % bs
        buf.input_ids[:b] = torch.randint(100, 1000, (b,), device="cuda")
        graphs.replay(b)  # captured here, under the patch
    return graphs, splits


def _step_cache(model, b: int, ctx: int, bs: int = 16):
    from rlforge.rollout.native.kv_cache import KVCache
    from rlforge.rollout.native.model_runner import ModelSpec

    spec = ModelSpec.from_module(model)
    cache = KVCache.allocate(spec.num_layers, b * -(-(ctx + 1) // bs) + 1, bs, spec.num_kv_heads, spec.head_dim,
                             torch.bfloat16, torch.device("cuda"))
    cache.data.normal_()
    return cache


def _decode_step_rows(name: str, sizes: tuple[int, ...], ctx: int, bw: Bandwidths) -> None:
    """One whole decode step (CUDA graph of the model runner) at ``b`` rows of ``ctx`` cached
    tokens for each ``b`` in ``sizes``, unsplit and with the automatic split choice, against the
    step's floor (spec bandwidth).  The unsplit rows replace the split choice by 1 for the capture."""
    try:
        model = build(name)
    except Exception as e:  # noqa: BLE001
        print(f"| decode step | {name} | failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]} |||||")
        return
    cost, bs = ModelCost.of(model), 16
    for b in sizes:
        ctx_read = ctx + 1
        nbytes = cost.weight_bytes + b * cost.embed_row_bytes + b * ctx_read * cost.kv_bytes_per_token
        floor_spec = step_floor(cost, b, ctx_read, bw.spec)
        shape = f"{name} B={b} ctx={ctx}"
        try:
            cache = _step_cache(model, b, ctx, bs)
        except Exception as e:  # noqa: BLE001
            print(f"| decode step | {shape} | failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]} "
                  "|||||")
            torch.cuda.empty_cache()
            continue
        for label, patch in (("unsplit", lambda *a, **k: 1), ("auto split", None)):
            graphs = None
            try:
                graphs, splits = _captured_step(model, cache, b, ctx, bs, patch)
                _kernel_row(f"decode step {label} (splits={splits})", shape, lambda g=graphs, b=b: g.replay(b), nbytes, bw,
                            floor_spec)
            except Exception as e:  # noqa: BLE001
                print(f"| decode step {label} | {shape} | failed: {type(e).__name__}: "
                      f"{(str(e).splitlines() or [''])[0][:150]} |||||", flush=True)
            del graphs
            torch.cuda.empty_cache()
        del cache
        torch.cuda.empty_cache()
    del model
    torch.cuda.empty_cache()


def _attention_graph_s(q, sets, cl, scale: float, **kw) -> float:
    """Seconds per paged decode attention call, as a CUDA graph of 8 calls over rotating caches."""
    from rlforge.rollout.native.triton_attention import paged_decode_attention

    def calls() -> None:
        for i in range(8):
            kc, vc, bt = sets[i % len(sets)]
            paged_decode_attention(q, kc, vc, bt, cl, scale, **kw)

    calls()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        calls()
    return cuda_time(g.replay, 5) / 8


def attention_sweep(bw: Bandwidths) -> None:
    """Decode attention launch settings (splits x pages per tile x warps) at the shapes where
    the decode step is slowest against its floor, each timed as a CUDA graph of 8 calls over
    rotating caches (no Python launch cost, no L2 reuse), as the captured decode step runs it."""
    from rlforge.rollout.native.triton_attention import auto_num_splits

    print("| shape | splits | pages/tile | warps | us/call | frac of spec bw |\n|---|---|---|---|---|---|")
    for name, h, kvh, d, b, ctx, splits in (
        ("0.5b", 14, 2, 64, 16, 8192, (4, 8, 16, 32)), ("0.5b", 14, 2, 64, 1, 8192, (16, 32, 64)),
        ("0.5b", 14, 2, 64, 64, 8192, (2, 4, 8)), ("7b", 28, 4, 128, 16, 8192, (4, 8, 16)),
        ("0.5b", 14, 2, 64, 1024, 512, (1,)), ("7b", 28, 4, 128, 256, 640, (1,)),
    ):
        sets, cl, nbytes = _paged_kv(b, ctx, kvh, d)
        q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16)
        auto = auto_num_splits(b, kvh, sets[0][2].shape[1] * 16, q.device)
        for s in splits:
            for pages in (4, 8, 16):
                for warps in (2, 4, 8):
                    try:
                        t = _attention_graph_s(q, sets, cl, d ** -0.5, pages_per_tile=pages, num_splits=s,
                                               num_warps=warps)
                        print(f"| {name} B={b} ctx={ctx} | {s}{' (auto)' if s == auto else ''} | {pages} | {warps} | "
                              f"{t * 1e6:.1f} | {_frac(nbytes, t, bw.spec)} |", flush=True)
                    except Exception as e:  # noqa: BLE001
                        print(f"| {name} B={b} ctx={ctx} | {s} | {pages} | {warps} | failed: {type(e).__name__} | |")
        del sets
        torch.cuda.empty_cache()


def step_profile(names: list[str], sizes: tuple[int, ...], ctx: int, bw: Bandwidths, replays: int = 20) -> None:
    """Where one captured decode step's time goes: each model in ``names`` at each batch in
    ``sizes`` x ``ctx`` context, the step timed (CUDA events), then ``replays`` replays under
    torch.profiler, their kernels summed per name and divided by ``replays`` (us per step)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    for name in names:
        model = build(name)
        cost = ModelCost.of(model)
        for b in sizes:
            cache = _step_cache(model, b, ctx)
            try:
                graphs, splits = _captured_step(model, cache, b, ctx, 16)
            except Exception as e:  # noqa: BLE001 - one size fails, the others still run
                traceback.print_exc(limit=4)
                print(f"\n### decode step {name} B={b}: failed: {type(e).__name__}: {e}")
                del cache
                torch.cuda.empty_cache()
                continue
            t = cuda_time(lambda g=graphs, b=b: g.replay(b), 10)
            floor = step_floor(cost, b, ctx + 1, bw.spec)
            with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(replays):
                    graphs.replay(b)
                torch.cuda.synchronize()
            per: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
            for ev in prof.events():
                if ev.device_type.name == "CUDA" and ev.device_time > 0:
                    per[ev.name[:90]][0] += 1
                    per[ev.name[:90]][1] += ev.device_time
            busy = sum(v[1] for v in per.values()) / replays
            n = sum(v[0] for v in per.values()) / replays
            print(f"\n### decode step {name} B={b} ctx={ctx} splits={splits}: {t * 1e6:.0f} us/step (floor "
                  f"{floor * 1e6:.0f} us, frac {floor / t:.2f}); kernels {n:.0f}/step, busy {busy:.0f} us/step, "
                  f"gaps {t * 1e6 - busy:.0f} us/step", flush=True)
            print("| kernel | calls/step | us/step | us/call | % busy |\n|---|---|---|---|---|")
            for k, (c, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[:14]:
                print(f"| {k} | {c / replays:.0f} | {us / replays:.1f} | {us / c:.2f} | {100 * us / replays / busy:.1f} |")
            del graphs, cache
            torch.cuda.empty_cache()
        del model
        torch.cuda.empty_cache()


def kernel_bench(bw: Bandwidths, step_models: list[str]) -> None:
    """Decode attention (Triton unsplit / split / automatic, torch gather) at Qwen2.5-0.5B / 7B
    shapes: 1024 rows of 512-token context, and 1, 16, 64 rows of 8k context; whole decode steps
    at 1, 16, 64 rows of 8k context against their floors; sampling one token from [1024, 151936]
    logits.  ``frac`` columns: achieved bytes/s over the spec and the copy bandwidth; ``floor
    frac``: the step's floor (max of bytes / spec bandwidth and FLOPs / peak) over its time."""
    from rlforge.rollout.native.sampler import sample_with_log_probs

    print(bw.line())
    print("| kernel | shape | ms | GB/s | frac of spec bw | frac of copy bw | floor frac |")
    print("|---|---|---|---|---|---|---|")
    short = [("torch", {})] + [(f"pages_per_tile={p}", {"pages_per_tile": p, "num_splits": 1}) for p in (1, 2, 4, 8)]
    long = [("unsplit", {"num_splits": 1}), ("auto", {"num_splits": "auto"})] + [
        (f"splits={s}", {"num_splits": s}) for s in (2, 4, 8, 16, 32, 64)]
    def guard(label: str, fn, *a) -> None:
        try:
            fn(*a)
        except Exception as e:  # noqa: BLE001 - one failing group of rows, the others still run
            traceback.print_exc(limit=3)
            print(f"| {label} | failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:150]} |||||", flush=True)
        torch.cuda.empty_cache()

    for name, h, kvh, d in (("0.5b", 14, 2, 64), ("7b", 28, 4, 128)):
        guard(f"decode attention {name} B=1024 ctx=512", _attention_rows, name, h, kvh, d, bw, 1024, 512, short)
        for b in (1, 16, 64):
            guard(f"decode attention {name} B={b} ctx=8192", _attention_rows, name, h, kvh, d, bw, b, 8192, long)
    for name in step_models:
        guard(f"decode step {name}", _decode_step_rows, name, (1, 16, 64), 8192, bw)
    logits = torch.randn(1024, 151936, device="cuda", dtype=torch.bfloat16)
    params = SamplingParams(temperature=1.0, max_new_tokens=1)
    for lp in (False, True):
        _kernel_row(f"sample (log-probs {lp})", "[1024, 151936] bf16",
                    lambda lp=lp: sample_with_log_probs(logits, params, None, lp), logits.numel() * 2, bw)


def _burst(part: str) -> int | None:
    """``N`` of a variant part ``burstN`` (the engine's ``max_decode_burst``), else None."""
    n = part[len("burst"):]
    return int(n) if part.startswith("burst") and n.isdigit() and int(n) > 0 else None


def _positive(text: str) -> int:
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-7b"], choices=sorted(PRESETS))
    ap.add_argument("--workloads", nargs="+", default=["random", "longtail", "grpo"],
                    choices=["random", "longtail", "grpo"])
    ap.add_argument("--prompts", type=_positive, default=1024)
    ap.add_argument("--groups", type=_positive, default=128)
    ap.add_argument("--longtail-prompts", type=_positive, default=512)
    ap.add_argument("--longtail-mean", type=float, default=500.0)
    ap.add_argument("--longtail-p99", type=float, default=3000.0)
    ap.add_argument("--longtail-max", type=_positive, default=4096)
    ap.add_argument("--hf-setups", default="generate,generate-old,static-compile,cb",
                    help="comma-separated transformers setups, each optionally with its own batch sizes "
                         f"(SETUP@256:1024), of: {', '.join(HF_SETUPS)}")
    ap.add_argument("--hf-batch", type=_positive, nargs="*", default=[256, 512, 1024],
                    help="random-workload batch sizes of every transformers setup (one batch each)")
    ap.add_argument("--longtail-hf-setups", default="generate,cb",
                    help="transformers setups on the long-tail workload (all of its prompts at once)")
    ap.add_argument("--hf-max-time", type=float, default=300.0,
                    help="generate's max_time per measured call (a row cut short says so)")
    ap.add_argument("--hf-models", nargs="*", default=["qwen2.5-0.5b"], choices=sorted(PRESETS),
                    help="models that also run the transformers setups")
    ap.add_argument("--max-num-seqs", type=_positive, nargs="+", default=[1024])
    ap.add_argument("--max-num-batched-tokens", type=_positive, default=16384,
                    help="the native engine's token budget per step (rollout.max_num_batched_tokens)")
    ap.add_argument("--variants", default="triton-graph,triton-graph-unfused,torch-graph,triton-eager",
                    help="native variants: ATTENTION-{graph,eager}[-unfused][-unpacked] (unfused: the layers' "
                         "elementwise work in eager torch ops instead of the fused Triton kernels; unpacked: "
                         "separate Q/K/V and gate/up GEMMs; warm: one engine kept across runs, as in training "
                         "with rollout.free_cache_engine=false, after one unmeasured run, as the generate rows "
                         "are warmed by a whole call; serial: overlapped steps off, each step read before the "
                         "next is launched)")
    ap.add_argument("--big-variants", default="triton-graph", help="variants for models not in --hf-models")
    ap.add_argument("--big-max-num-seqs", type=_positive, nargs="+", default=[256, 1024])
    ap.add_argument("--skip-grpo", action="store_true", help="the same as leaving grpo out of --workloads")
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--new-tokens", type=_positive, default=512)
    ap.add_argument("--native-reps", type=_positive, default=1,
                    help="native runs per row (random and long tail); the row is the median run, with min and max")
    ap.add_argument("--attention-sweep", action="store_true",
                    help="time decode attention launch settings (splits, pages per tile, warps) in CUDA graphs and exit")
    ap.add_argument("--step-sizes", type=_positive, nargs="+", default=[1, 16, 64],
                    help="batch sizes for --step-profile (contexts: 8k, or 512 from batch 256 up)")
    ap.add_argument("--step-profile", action="store_true",
                    help="profile whole captured decode steps (--kernel-step-models at B=1,16,64 x 8k) and exit")
    ap.add_argument("--profile", action="store_true", help="profile one native run of the first model and exit")
    ap.add_argument("--profile-warm", action="store_true", help="with --profile: on a warm engine (as the -warm rows)")
    ap.add_argument("--kernels", action="store_true",
                    help="time the decode attention kernels, whole decode steps at 8k context and sampling, and exit")
    ap.add_argument("--kernel-step-models", nargs="*", default=["qwen2.5-0.5b", "qwen2.5-7b"], choices=sorted(PRESETS),
                    help="models whose whole decode step --kernels times")
    args = ap.parse_args()
    for v in f"{args.variants},{args.big_variants}".split(","):
        parts = v.split("-")
        flags = [x for x in parts[2:] if not _burst(x)]
        if (len(parts) < 2 or parts[0] not in ("triton", "torch") or parts[1] not in ("graph", "eager")
                or not set(flags) <= {"unfused", "unpacked", "warm", "serial"} or len(set(parts[2:])) != len(parts[2:])
                or len(parts[2:]) - len(flags) > 1):
            ap.error(f"unknown variant {v!r}: expected ATTENTION-{{graph,eager}}[-unfused][-unpacked][-warm][-serial]"
                     "[-burstN], ATTENTION triton or torch, N >= 1 decode steps between host reads (the engine's 64)")
    for key in ("hf_setups", "longtail_hf_setups"):
        names = [x for x in getattr(args, key).split(",") if x]
        parsed = []
        for x in names:
            setup, _, sizes = x.partition("@")
            if setup not in HF_SETUPS:
                ap.error(f"unknown --{key.replace('_', '-')} {setup!r}: choose from {', '.join(HF_SETUPS)}")
            try:
                parsed.append((setup, [_positive(v) for v in sizes.split(":")] if sizes else None))
            except (ValueError, argparse.ArgumentTypeError):
                ap.error(f"--{key.replace('_', '-')} {x!r}: batch sizes after @ are positive ints joined by ':'")
        setattr(args, key, parsed)
    try:
        args.longtail = LongTail(args.longtail_mean, args.longtail_p99, args.longtail_max)
    except ValueError as e:
        ap.error(str(e))
    if args.skip_grpo and "grpo" in args.workloads:
        args.workloads.remove("grpo")
    if not torch.cuda.is_available():
        ap.error("this benchmark needs a CUDA GPU (none is visible)")
    return args


def _hf_rows(model, name: str, wl: Workload, sizes: list[int], setups: list[tuple[str, list[int] | None]],
             cost: ModelCost, bw: Bandwidths, max_time: float, rows: list[Row]) -> None:
    """Append one row per (setup, batch size) to ``rows`` as each is measured (a run stopped by
    its time limit keeps them); a setup's own sizes (``SETUP@a:b``) replace ``sizes``."""
    for setup, own in setups:
        for b in own or sizes:
            part = wl.head(b)
            kind = "hf " + HF_SETUPS[setup].kind

            def go(part=part, setup=setup, b=b):
                ids = part.batch["input_ids"].cuda()
                tokens, sec, note = run_setup(model, setup, ids, part.lengths, max_time=max_time)
                return tokens, sec, note, math.nan

            row = attempt(Row(name, wl.name, kind, f"{setup} batch {len(part.lengths)}"), go)
            if not row.failed:
                row.floor_spec_s, row.floor_copy_s = (f.total_s for f in floors(cost, part.lengths, b, bw))
            rows.append(row)


def _native_row(model, name: str, wl: Workload, v: str, mns: int, cost: ModelCost, bw: Bandwidths, reps: int = 1,
                **kw) -> Row:
    attn, mode, *rest = v.split("-")
    fs, fc = floors(cost, wl.lengths, mns, bw)

    def go():
        opts = dict(attention=attn, enforce_eager=mode == "eager", fused_kernels=False if "unfused" in rest else None,
                    pack_weights=False if "unpacked" in rest else None,
                    **({"max_decode_burst": b} if (b := next(filter(None, map(_burst, rest)), None)) else {}),
                    **({"overlap_steps": False} if "serial" in rest else {}), **kw)
        engine = None
        if "warm" in rest:  # one engine for every run, its cache and graphs kept: one unmeasured run first
            engine = native_engine(model, mns, free_cache_engine=False, **opts)
            run_native(model, wl, mns, engine)
        runs = [run_native(model, wl, mns, engine, **opts) for _ in range(reps)]
        secs = sorted(r[1] for r in runs)
        tokens, sec, m = runs[[r[1] for r in runs].index(secs[len(secs) // 2])]  # the median run
        note = phases(m)
        if reps > 1:
            note = f"median of {reps} runs (min {secs[0]:.2f} s, max {secs[-1]:.2f} s); {note}"
        if "enable_prefix_caching" in kw:
            note = f"prefix hits {m['rollout/prefix_hit_blocks']:.0f} blocks; {note}"
        return tokens, sec, note, decode_step_frac(fs, m)

    row = attempt(Row(name, wl.name, "native", f"{v} seqs={mns}" + (
        f" prefix {'on' if kw['enable_prefix_caching'] else 'off'}" if "enable_prefix_caching" in kw else "")), go)
    row.floor_spec_s, row.floor_copy_s = fs.total_s, fc.total_s
    return row


def _model_rows(name: str, args: argparse.Namespace, bw: Bandwidths, rows: list[Row]) -> None:
    """Append ``name``'s rows to ``rows`` as they are measured."""
    model = build(name)
    cost, vocab, small = ModelCost.of(model), model.config.vocab_size, name in args.hf_models
    # unmeasured: the process's first native generate pays one-time costs (Triton compiles,
    # cuBLAS heuristics) that would otherwise land in whichever row runs first
    run_native(model, Workload("warm-up", prompts(64, vocab, seed=3), np.full(64, 16)), 64)
    variants = (args.variants if small else args.big_variants).split(",")
    sizes = args.max_num_seqs if small else args.big_max_num_seqs
    for w in args.workloads:  # native rows first (seconds), then the transformers rows (minutes)
        if w == "random":
            wl = Workload(f"random x{args.prompts}", prompts(args.prompts, vocab, seed=0),
                          np.full(args.prompts, args.new_tokens))
            hf_sizes, hf_setups = args.hf_batch, args.hf_setups
        elif w == "longtail":
            n = args.longtail_prompts
            wl = Workload(f"longtail x{n}", prompts(n, vocab, seed=4), args.longtail.sample(n, seed=0))
            print(f"longtail lengths: {describe(wl.lengths)} (LongTail{args.longtail})", flush=True)
            hf_sizes, hf_setups = [n], [(x, None) for x, _ in args.longtail_hf_setups]
        else:
            if not small:
                continue
            n = args.groups * 8
            wl = Workload(f"grpo {args.groups}x8", prompts(n, vocab, seed=2, group=8), np.full(n, args.new_tokens))
            for prefix in (True, False):
                rows.append(_native_row(model, name, wl, variants[0], max(args.max_num_seqs), cost, bw,
                                        enable_prefix_caching=prefix))
            continue
        for mns in sizes:
            for v in variants:
                rows.append(_native_row(model, name, wl, v, mns, cost, bw, reps=args.native_reps))
        if small:
            _hf_rows(model, name, wl, hf_sizes, hf_setups, cost, bw, args.hf_max_time, rows)
    del model
    torch.cuda.empty_cache()


def _fmt(x: float, spec: str = ".2f") -> str:
    return "–" if not math.isfinite(x) else format(x, spec)


def table(rows: list[Row]) -> None:
    """The markdown table; ratios over the fastest transformers / continuous-batching row of the
    same model and workload (grpo rows: of the random workload, whose lengths they share)."""
    def best(model: str, workload: str, kinds: tuple[str, ...]) -> float:
        if workload.startswith("grpo"):
            workload = "random"
        vals = [r.tok_s for r in rows if r.model == model and r.workload.split()[0] == workload.split()[0]
                and r.engine in kinds and math.isfinite(r.tok_s)]
        return max(vals, default=math.nan)

    print()
    print("| model | workload | engine | setting | output tok/s | x best hf | x best cb | floor frac (spec bw) | "
          "floor frac (copy bw) | decode step frac | time s | tokens | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.failed:
            print(f"| {r.model} | {r.workload} | {r.engine} | {r.setting} | failed: {r.failed} ||||||||")
            continue
        bh = best(r.model, r.workload, ("hf generate", "hf cb"))
        bc = best(r.model, r.workload, ("hf cb",))
        print(f"| {r.model} | {r.workload} | {r.engine} | {r.setting} | {r.tok_s:,.0f} | {_fmt(r.tok_s / bh, '.1f')} | "
              f"{_fmt(r.tok_s / bc, '.1f')} | {_fmt(r.floor_spec_s / r.seconds)} | {_fmt(r.floor_copy_s / r.seconds)} | "
              f"{_fmt(r.decode_step_frac)} | {r.seconds:.1f} | {r.tokens:,} | {r.extra} |")


def main() -> None:
    args = _args()
    MAX_NUM_BATCHED_TOKENS[0] = args.max_num_batched_tokens
    bw = Bandwidths()
    if args.kernels:
        kernel_bench(bw, args.kernel_step_models)
        return
    if args.step_profile:
        print(bw.line(), flush=True)
        for b in args.step_sizes:
            step_profile(args.kernel_step_models, (b,), 512 if b >= 256 else 8192, bw)
        return
    if args.attention_sweep:
        print(bw.line(), flush=True)
        attention_sweep(bw)
        return
    if args.profile:
        model = build(args.models[0])
        wl = Workload("random", prompts(args.prompts, model.config.vocab_size, seed=0),
                      np.full(args.prompts, args.new_tokens))
        profile(model, wl, args.max_num_seqs[0], warm=args.profile_warm)
        return
    print(bw.line(), flush=True)
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}", flush=True)
    rows: list[Row] = []

    def report() -> None:
        table(rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump([r.__dict__ | {"tok_s": r.tok_s} for r in rows], f, indent=1, default=str)

    def on_term(signum, frame) -> None:  # a plan's `timeout` stops the run: keep the rows measured so far
        print(f"\nstopped by signal {signum} after {len(rows)} rows", flush=True)
        report()
        sys.exit(124)

    signal.signal(signal.SIGTERM, on_term)
    for name in args.models:
        try:
            _model_rows(name, args, bw, rows)
        except Exception as e:  # noqa: BLE001 - e.g. the model does not fit: the other models still run
            traceback.print_exc(limit=3)
            rows.append(Row(name, "-", "-", "-", failed=f"{type(e).__name__}: {str(e).splitlines()[:1]}"))
            torch.cuda.empty_cache()
    report()


if __name__ == "__main__":
    main()

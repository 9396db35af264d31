"""Rollout throughput: rlforge's native engine against transformers' ``generate``, same run, same GPU.

    python benchmarks/rollout_throughput.py --models qwen2.5-0.5b qwen2.5-7b

Workloads (random-weight ``preset:`` models in bf16, sampling at temperature 1, EOS ignored):
  random   ``--prompts`` (1024) prompts of 256 random tokens, 512 new tokens each;
  grpo     ``--groups`` (128) prompts x n=8, same lengths, with and without prefix sharing.

Rows: transformers ``generate`` at each ``--hf-batch`` size (one batch each; its best size is
the baseline), and the native engine with Triton or torch decode attention, with and without
CUDA graphs, with and without the fused Triton layer kernels (``-unfused``), with and without
packed Q/K/V and gate/up GEMMs (``-unpacked``).  Each row reports output tokens/s, the ratio to
the best ``generate``, and the fraction of the decode roofline: the bytes one decode step must
read (all weights once, plus every running sequence's K/V so far) summed over the run's decode
steps, over the device bandwidth measured in the same run, divided by the measured time.  The
compute floor (2 x parameters x tokens over the bf16 peak) is printed beside it, since a large
batch can be compute-bound before it is bandwidth-bound.  ``decode step frac`` is the same
roofline for the decode steps alone: the mean floor of one decode step over the mean measured
decode step (``rollout/decode_s`` less graph capture, over ``rollout/decode_steps``); the
whole-run fraction also charges the prefill-carrying steps, whose compute the bandwidth
roofline counts as zero.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass

import torch
from transformers import AutoModelForCausalLM

from rlforge.batch import Batch
from rlforge.models.presets import PRESETS
from rlforge.rollout import SamplingParams
from rlforge.rollout.native import NativeRollout

PROMPT_LEN, NEW_TOKENS = 256, 512
PEAK_BF16 = 989e12  # H100/H200 dense bf16 (rlforge.perf.flops)


@dataclass
class Row:
    model: str
    workload: str
    engine: str
    setting: str
    tokens: int
    seconds: float
    roofline_s: float
    compute_s: float
    extra: str = ""
    decode_step_frac: float = math.nan

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


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


def floors(model: torch.nn.Module, n: int, max_num_seqs: int, bw: float) -> tuple[float, float]:
    """(decode memory roofline seconds, compute floor seconds) for ``n`` sequences of
    PROMPT_LEN + NEW_TOKENS decoded ``max_num_seqs`` at a time (``-(-n // max_num_seqs)``
    waves of NEW_TOKENS decode steps)."""
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    wbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_tok = c.num_hidden_layers * 2 * c.num_key_value_heads * head_dim * 2
    total = 0.0
    left = n
    while left > 0:
        b = min(left, max_num_seqs)
        ctx_sum = b * sum(PROMPT_LEN + t for t in range(NEW_TOKENS))
        total += NEW_TOKENS * wbytes + ctx_sum * kv_tok
        left -= b
    flops = 2 * params * n * (PROMPT_LEN + NEW_TOKENS)
    return total / bw, flops / PEAK_BF16


def run_hf(model, n_batch: int, vocab: int) -> tuple[int, float]:
    batch = prompts(n_batch, vocab, seed=1)
    ids = batch["input_ids"].cuda()
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW_TOKENS,
              min_new_tokens=NEW_TOKENS, pad_token_id=0, eos_token_id=None)
    model.generate(ids[:2], attention_mask=torch.ones_like(ids[:2]), **{**kw, "max_new_tokens": 4, "min_new_tokens": 4})
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    torch.cuda.synchronize()
    return (out.shape[1] - PROMPT_LEN) * out.shape[0], time.perf_counter() - t


def run_native(model, batch: Batch, max_num_seqs: int, **kw) -> tuple[int, float, dict[str, float]]:
    eng = NativeRollout(model, [], 0, torch.device("cuda"), progress=False, max_num_seqs=max_num_seqs,
                        max_num_batched_tokens=16384, ignore_eos=True, seed=0, **kw)
    params = SamplingParams(temperature=1.0, max_new_tokens=NEW_TOKENS)
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = eng.generate(batch, params)
    torch.cuda.synchronize()
    return int(out["response_mask"].sum()), time.perf_counter() - t, eng.metrics()


def decode_step_frac(roofline_s: float, n: int, max_num_seqs: int, m: dict[str, float]) -> float:
    """The mean decode step's floor (``roofline_s`` over the run's waves x NEW_TOKENS steps)
    over the mean measured decode step (graph capture left out)."""
    steps = m.get("rollout/decode_steps", 0.0)
    measured = m.get("rollout/decode_s", 0.0) - m.get("rollout/graph_capture_s", 0.0)
    if steps <= 0 or measured <= 0:
        return math.nan
    return (roofline_s / (-(-n // max_num_seqs) * NEW_TOKENS)) / (measured / steps)


def phases(m: dict[str, float]) -> str:
    """Where a native run's time went, from the engine's ``rollout/`` metrics."""
    steps = max(m.get("rollout/decode_steps", 0.0), 1.0)
    return (f"wake {m['rollout/wake_s']:.2f}s, prefill steps {m['rollout/mixed_step_s']:.2f}s, decode "
            f"{m['rollout/decode_s']:.2f}s ({m['rollout/decode_s'] / steps * 1e3:.1f} ms/step, graph capture "
            f"{m['rollout/graph_capture_s']:.2f}s), host {m['rollout/host_s']:.2f}s")


def profile(model, batch: Batch, max_num_seqs: int) -> None:
    """Host (cProfile, top functions by cumulative time) and device (torch.profiler, top
    kernels) views of one native generate, to see where the time goes."""
    import cProfile
    import pstats

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    from rlforge.perf.torch_trace import render_markdown, summarize

    run_native(model, batch, max_num_seqs)  # warm-up
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        run_native(model, batch, max_num_seqs)
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70), flush=True)
    trace = "rollout_profile_trace.json"
    prof.export_chrome_trace(trace)
    print(render_markdown(summarize(trace, num_gaps=5, top_kernels=25, min_gap_ms=1.0)), flush=True)
    pr = cProfile.Profile()
    pr.enable()
    tokens, sec, m = run_native(model, batch, max_num_seqs)
    pr.disable()
    print(f"profiled native: {tokens} tokens in {sec:.2f} s ({tokens / sec:,.0f} tok/s) {m}")
    pstats.Stats(pr).sort_stats("tottime").print_stats(20)


def cuda_time(fn, iters: int = 20) -> float:
    """Mean seconds of ``fn()`` on the GPU (CUDA events, after 3 warm-ups)."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def _attention_rows(name: str, h: int, kvh: int, d: int, bw: float, triton_fn, torch_fn) -> None:
    b, ctx, bs = 1024, 512, 16
    nb = b * ctx // bs
    kc = torch.randn(nb, bs, kvh, d, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    bt = torch.randperm(nb, device="cuda", dtype=torch.int32).view(b, ctx // bs)
    cl = torch.full((b,), ctx, device="cuda", dtype=torch.int32)
    q = torch.randn(b, h, d, device="cuda", dtype=torch.bfloat16)
    nbytes = 2 * kc.numel() * 2
    rows = [("decode attention torch", lambda: torch_fn(q, kc, vc, bt, cl, d ** -0.5))]
    rows += [(f"decode attention triton pages_per_tile={p}",
              lambda p=p: triton_fn(q, kc, vc, bt, cl, d ** -0.5, pages_per_tile=p)) for p in (1, 2, 4, 8)]
    for label, fn in rows:
        t = cuda_time(fn, 10)
        print(f"| {label} | {name} B={b} ctx={ctx} | {t * 1e3:.3f} | {nbytes / t / 1e9:,.0f} | {nbytes / t / bw:.2f} |")


def kernel_bench(bw: float) -> None:
    """Decode attention (Triton vs torch gather) at Qwen2.5-0.5B / 7B shapes, 1024 rows of
    512-token context, as achieved bandwidth; and sampling one token from [1024, 151936] logits."""
    from rlforge.rollout.native.attention import decode_attention_torch
    from rlforge.rollout.native.sampler import sample_with_log_probs
    from rlforge.rollout.native.triton_attention import paged_decode_attention

    print("| kernel | shape | ms | GB/s | frac of copy bw |")
    print("|---|---|---|---|---|")
    for name, h, kvh, d in (("0.5b", 14, 2, 64), ("7b", 28, 4, 128)):
        _attention_rows(name, h, kvh, d, bw, paged_decode_attention, decode_attention_torch)
    logits = torch.randn(1024, 151936, device="cuda", dtype=torch.bfloat16)
    params = SamplingParams(temperature=1.0, max_new_tokens=1)
    for lp in (False, True):
        t = cuda_time(lambda lp=lp: sample_with_log_probs(logits, params, None, lp))
        print(f"| sample (log-probs {lp}) | [1024, 151936] bf16 | {t * 1e3:.3f} | {logits.numel() * 2 / t / 1e9:,.0f} | "
              f"{logits.numel() * 2 / t / bw:.2f} |")


def _positive(text: str) -> int:
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-7b"], choices=sorted(PRESETS))
    ap.add_argument("--prompts", type=_positive, default=1024)
    ap.add_argument("--groups", type=_positive, default=128)
    ap.add_argument("--hf-batch", type=_positive, nargs="*", default=[256, 512, 1024])
    ap.add_argument("--hf-models", nargs="*", default=["qwen2.5-0.5b"], choices=sorted(PRESETS),
                    help="models that also run generate")
    ap.add_argument("--max-num-seqs", type=_positive, nargs="+", default=[1024])
    ap.add_argument("--variants", default="triton-graph,triton-graph-unfused,torch-graph,triton-eager",
                    help="native variants: ATTENTION-{graph,eager}[-unfused][-unpacked] (unfused: the layers' "
                         "elementwise work in eager torch ops instead of the fused Triton kernels; unpacked: "
                         "separate Q/K/V and gate/up GEMMs)")
    ap.add_argument("--big-variants", default="triton-graph", help="variants for models not in --hf-models")
    ap.add_argument("--big-max-num-seqs", type=_positive, nargs="+", default=[256, 1024])
    ap.add_argument("--skip-grpo", action="store_true")
    ap.add_argument("--json", default=None, help="also write the rows here")
    ap.add_argument("--new-tokens", type=_positive, default=512)
    ap.add_argument("--profile", action="store_true", help="profile one native run of the first model and exit")
    ap.add_argument("--kernels", action="store_true", help="time the decode attention and sampling kernels and exit")
    args = ap.parse_args()
    for v in f"{args.variants},{args.big_variants}".split(","):
        parts = v.split("-")
        if (len(parts) < 2 or parts[0] not in ("triton", "torch") or parts[1] not in ("graph", "eager")
                or not set(parts[2:]) <= {"unfused", "unpacked"} or len(set(parts[2:])) != len(parts[2:])):
            ap.error(f"unknown variant {v!r}: expected ATTENTION-{{graph,eager}}[-unfused][-unpacked], "
                     "ATTENTION triton or torch")
    if not torch.cuda.is_available():
        ap.error("this benchmark needs a CUDA GPU (none is visible)")
    globals()["NEW_TOKENS"] = args.new_tokens
    if args.kernels:
        kernel_bench(measure_bandwidth())
        return
    if args.profile:
        model = build(args.models[0])
        profile(model, prompts(args.prompts, model.config.vocab_size, seed=0), args.max_num_seqs[0])
        return

    bw = measure_bandwidth()
    print(f"device: {torch.cuda.get_device_name()}  measured copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    rows: list[Row] = []
    for name in args.models:
        model = build(name)
        vocab = model.config.vocab_size
        if name in args.hf_models:
            for b in args.hf_batch:
                tokens, sec = run_hf(model, b, vocab)
                roof, comp = floors(model, b, b, bw)
                rows.append(Row(name, f"random x{b}", "hf generate", f"batch {b}", tokens, sec, roof, comp))
                print(rows[-1], flush=True)
        batch = prompts(args.prompts, vocab, seed=0)
        # unmeasured: the process's first native generate pays one-time costs (Triton compiles,
        # cuBLAS heuristics) that would otherwise land in whichever row runs first
        run_native(model, prompts(64, vocab, seed=3), 64)
        small = name in args.hf_models
        for mns in args.max_num_seqs if small else args.big_max_num_seqs:
            for v in (args.variants if small else args.big_variants).split(","):
                attn, mode, *rest = v.split("-")
                tokens, sec, m = run_native(model, batch, mns, attention=attn, enforce_eager=mode == "eager",
                                            fused_kernels=False if "unfused" in rest else None,
                                            pack_weights=False if "unpacked" in rest else None)
                roof, comp = floors(model, args.prompts, mns, bw)
                rows.append(Row(name, f"random x{args.prompts}", "native", f"{v} seqs={mns}", tokens, sec, roof, comp,
                                phases(m), decode_step_frac(roof, args.prompts, mns, m)))
                print(rows[-1], flush=True)
        if not args.skip_grpo and small:
            group = prompts(args.groups * 8, vocab, seed=2, group=8)
            for prefix in (True, False):
                tokens, sec, m = run_native(model, group, max(args.max_num_seqs), enable_prefix_caching=prefix)
                roof, comp = floors(model, args.groups * 8, max(args.max_num_seqs), bw)
                rows.append(Row(name, f"grpo {args.groups}x8", "native", f"prefix {'on' if prefix else 'off'}",
                                tokens, sec, roof, comp,
                                f"prefix hits {m['rollout/prefix_hit_blocks']:.0f} blocks; {phases(m)}",
                                decode_step_frac(roof, args.groups * 8, max(args.max_num_seqs), m)))
                print(rows[-1], flush=True)
        del model
        torch.cuda.empty_cache()

    best_hf = {r.model: max((x.tok_s for x in rows if x.model == r.model and x.engine == "hf generate"), default=math.nan)
               for r in rows}
    print()
    print("| model | workload | engine | setting | output tok/s | x best generate | decode roofline frac | "
          "decode step frac | compute floor frac | time s | note |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        step = "–" if math.isnan(r.decode_step_frac) else f"{r.decode_step_frac:.2f}"
        print(f"| {r.model} | {r.workload} | {r.engine} | {r.setting} | {r.tok_s:,.0f} | "
              f"{r.tok_s / best_hf[r.model]:.1f} | {r.roofline_s / r.seconds:.2f} | {step} | "
              f"{r.compute_s / r.seconds:.2f} | {r.seconds:.1f} | {r.extra} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.__dict__ | {"tok_s": r.tok_s} for r in rows], f, indent=1)


if __name__ == "__main__":
    main()

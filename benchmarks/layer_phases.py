"""Per-phase time of the persistent decode layer kernel (rlforge/rollout/native/triton_decode_layer.py).

Runs on one GPU: Qwen2.5-0.5B shape, random weights, ``--batch`` rows of ``--ctx`` cached tokens.
Each row: the 24 layers as one CUDA graph, with only phase ``p`` launched per layer (``PHASE=p``,
each phase its own launch; ``all`` is the one-launch kernel with its barriers), median us per
step over 20 replays.  The phases do not depend on each other's results for their timing.

    python benchmarks/layer_phases.py --batch 16 --ctx 8192 --variants 4/128 8/256

``--variants``: the kernel's options, ``WARPS[/TILE]`` (rollout_throughput.layer_variant).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_throughput import _step_cache, build, layer_variant  # noqa: E402

from rlforge.rollout.native.model_runner import ModelRunner  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=8192)
    ap.add_argument("--variants", type=layer_variant, nargs="+", default=[layer_variant("4/128")])
    ap.add_argument("--phases", nargs="+", default=["all", "0", "1", "2", "3", "4"],
                    help="'all' (one launch) and/or single phases 0-4")
    args = ap.parse_args()
    model = build(args.model)
    b, ctx, bs = args.batch, args.ctx, 16
    cache = _step_cache(model, b, ctx, bs)
    r = ModelRunner(model, cache, "triton", layer_kernel=True)
    per_row = -(-(ctx + 1) // bs)
    bt = torch.randperm(b * per_row, device="cuda", dtype=torch.int32).view(b, per_row)
    cl = torch.full((b,), ctx + 1, dtype=torch.int32, device="cuda")
    pos = torch.full((b,), ctx, dtype=torch.long, device="cuda")
    slot = bt[:, ctx // bs].long() * bs + ctx % bs
    h0 = torch.randn(b, model.config.hidden_size, device="cuda", dtype=torch.bfloat16)
    cos, sin = r._rope(pos, h0.dtype)
    print(f"| {args.model} B={b} ctx={ctx} | warps/tile | phase | us/step | us/layer |\n"
          "|---|---|---|---|---|")
    for variant in args.variants:
        k = r.layer_kernel
        for key, value in variant.items():
            setattr(k, key, value)
        name = f"{k.num_warps}/{k.attention_tile}"
        for phase in args.phases:
            k.phases = (-1,) if phase == "all" else (int(phase),)
            fn = lambda k=k: k(h0, cos, sin, slot, bt, cl)  # noqa: E731
            for _ in range(2):
                fn()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                fn()
            ts = []
            for _ in range(20):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                g.replay()
                e.record()
                e.synchronize()
                ts.append(s.elapsed_time(e) * 1e3)
            t = sorted(ts)[len(ts) // 2]
            print(f"| | {name} | {phase} | {t:.0f} | {t / model.config.num_hidden_layers:.1f} |", flush=True)


if __name__ == "__main__":
    main()

"""The chunked LM head's forward + backward, torch chunks against Triton chunks, same inputs, one GPU.

    python benchmarks/head_bench.py                      # Qwen2.5-0.5B head (896 x 151,936), 32k positions
    python benchmarks/head_bench.py --hidden 1536 --tokens 16384 --chunks 2048 8192

Per row: ``impl_backend`` (``torch`` or ``triton``), chunk size, with the entropy (as the on-policy
update computes it, for ``actor/entropy``) or without; median and min over ``--reps`` repetitions of
``--iters`` timed forward+backward calls each (CUDA events), after one warm-up call.  The roofline:
the four GEMMs (forward, the backward's recompute, ``dL/dh``, ``dL/dW``) at the bf16 dense peak, and
the Triton path's logit bytes (2 + 2 + 4 per logit for bf16: the forward GEMM's write and one read, the
recompute's write, one read and one write) at the spec bandwidth; the ratio column divides by the
torch row of the same chunk size.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from rlforge.roles.fused_head import ChunkedLinearLogProbs

PEAK_BF16 = 989e12
"""H200 SXM dense bf16 FLOP/s (NVIDIA's spec sheet)."""
BANDWIDTH = 4.8e12
"""H200 HBM3e bytes/s (spec)."""


def time_one(backend: str, h: torch.Tensor, w: torch.Tensor, y: torch.Tensor, g: torch.Tensor, chunk: int,
             with_entropy: bool, iters: int) -> float:
    """Mean seconds of one forward + backward over ``iters`` calls."""
    def call() -> None:
        h.grad = None
        w.grad = None
        logp, _ = ChunkedLinearLogProbs.apply(h, w, None, y, 1.0, chunk, with_entropy, backend)
        (logp * g).sum().backward()
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--hidden", type=int, default=896)
    p.add_argument("--vocab", type=int, default=151_936)
    p.add_argument("--tokens", type=int, default=32_768, help="response positions (rows of the head)")
    p.add_argument("--chunks", type=int, nargs="+", default=[2048, 8192])
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    h = (torch.randn(args.tokens, args.hidden, device=dev) * 0.5).bfloat16().requires_grad_()
    w = (torch.randn(args.vocab, args.hidden, device=dev) * 0.02).bfloat16().requires_grad_()
    y = torch.randint(0, args.vocab, (args.tokens,), device=dev)
    g = torch.randn(args.tokens, device=dev)
    flops = 4 * 2 * args.tokens * args.hidden * args.vocab
    gemm_floor = flops / PEAK_BF16
    bytes_floor = 8 * args.tokens * args.vocab / BANDWIDTH
    print(f"head {args.hidden} x {args.vocab}, {args.tokens} positions, bf16; GEMM floor {gemm_floor * 1e3:.1f} ms, "
          f"Triton logit-bytes floor {bytes_floor * 1e3:.1f} ms (sum {1e3 * (gemm_floor + bytes_floor):.1f} ms)")
    print(f"{'backend':8} {'chunk':>6} {'entropy':>7} {'median ms':>10} {'min ms':>8} {'vs torch':>9} {'of floor':>9}")
    for chunk in args.chunks:
        for with_entropy in (True, False):
            base = None
            for backend in ("torch", "triton"):
                ts = [time_one(backend, h, w, y, g, chunk, with_entropy, args.iters) for _ in range(args.reps)]
                med = statistics.median(ts)
                base = med if base is None else base
                print(f"{backend:8} {chunk:>6} {str(with_entropy):>7} {med * 1e3:>10.2f} {min(ts) * 1e3:>8.2f} "
                      f"{base / med:>8.2f}x {(gemm_floor + bytes_floor) / med:>8.1%}")
    print(f"peak allocated {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

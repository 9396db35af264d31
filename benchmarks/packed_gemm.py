"""Packed projection GEMMs against separate ones, per decoder layer, on one GPU (bf16).

    python benchmarks/packed_gemm.py

For the Qwen2.5 0.5B, 1.5B and 7B shapes and M rows (decode batch sizes, and 8192 for a
prefill chunk), times Q, K, V as three ``F.linear`` calls (with biases) against one GEMM on the
packed ``[q; k; v]`` matrix, and gate, up as two against one on ``[gate; up]`` (what
``rlforge/rollout/native/rollout_weights.py`` does), side by side, with CUDA events over 50
calls after 5 warm-up calls.  The last column is the saving per decode step over all layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SHAPES = {  # hidden, q rows, k/v rows each, intermediate, layers
    "0.5b": (896, 896, 128, 4864, 24),
    "1.5b": (1536, 1536, 256, 8960, 28),
    "7b": (3584, 3584, 512, 18944, 28),
}


def cuda_us(fn, iters: int = 50) -> float:
    """Mean microseconds per call of ``fn`` (CUDA events, after 5 warm-up calls)."""
    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / iters * 1000


def layer_times(hidden: int, nq: int, nkv: int, inter: int, m: int) -> tuple[float, float, float, float]:
    """µs of (Q/K/V separate, QKV packed, gate/up separate, gate+up packed) for ``m`` rows."""
    dev, bf = torch.device("cuda"), torch.bfloat16
    x = torch.randn(m, hidden, device=dev, dtype=bf)
    wq, wk, wv = (torch.randn(n, hidden, device=dev, dtype=bf) * 0.02 for n in (nq, nkv, nkv))
    bq, bk, bv = (torch.randn(n, device=dev, dtype=bf) for n in (nq, nkv, nkv))
    wqkv, bqkv = torch.cat([wq, wk, wv]), torch.cat([bq, bk, bv])
    wg, wu = (torch.randn(inter, hidden, device=dev, dtype=bf) * 0.02 for _ in range(2))
    wgu = torch.cat([wg, wu])
    return (cuda_us(lambda: (F.linear(x, wq, bq), F.linear(x, wk, bk), F.linear(x, wv, bv))),
            cuda_us(lambda: F.linear(x, wqkv, bqkv)),
            cuda_us(lambda: (F.linear(x, wg), F.linear(x, wu))),
            cuda_us(lambda: F.linear(x, wgu)))


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("packed_gemm.py: this benchmark needs a CUDA GPU")
    print("| shape | M rows | Q,K,V separate µs | QKV packed µs | gate, up separate µs | gate+up packed µs | "
          "saving per step, all layers ms |")
    print("|---|---|---|---|---|---|---|")
    for name, (hidden, nq, nkv, inter, layers) in SHAPES.items():
        for m in (128, 256, 512, 1024, 8192):
            qkv_sep, qkv_pack, gu_sep, gu_pack = layer_times(hidden, nq, nkv, inter, m)
            saving = layers * ((qkv_sep - qkv_pack) + (gu_sep - gu_pack)) / 1000
            print(f"| {name} | {m} | {qkv_sep:.1f} | {qkv_pack:.1f} | {gu_sep:.1f} | {gu_pack:.1f} | {saving:.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()

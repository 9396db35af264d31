"""Decode-size layer GEMMs: cuBLAS with the separate fused elementwise kernels (the model
runner's fused path) against ``skinny_linear`` with that work fused in, on one GPU (bf16).

    python benchmarks/skinny_gemm.py [--sweep] [--models 0.5b 7b] [--rows 1 16 64]

Rows: the MLP-and-projections half of one decoder layer as the runner runs it at decode
(``add_rms_norm`` -> QKV GEMM; O GEMM -> ``add_rms_norm`` -> gate/up GEMM -> ``silu_mul`` ->
down GEMM, i.e. 4 GEMMs and 3 elementwise launches; the skinny chain is 4 launches), for every
layer of the model in turn (distinct weights, so no layer's weights are still in L2), captured
in one CUDA graph as the decode step is; and each GEMM alone, cuBLAS ``F.linear`` against
``skinny_linear`` without fused work.  Both sides read the same weights.  Times: median of 5
replays of the graph (``cuda_time``, CUDA events, 3 warm-ups); bandwidth columns: weight bytes
over time against the spec 4.8 TB/s (an H200).  ``--sweep`` also times launch settings
(``SkinnyConfig``) per GEMM at each row count and prints the fastest few.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_throughput import cuda_time  # noqa: E402

SPEC_BW = 4.8e12
SHAPES = {  # hidden, q rows, k/v rows each, intermediate, layers, vocab
    "0.5b": (896, 896, 128, 4864, 24, 151936),
    "7b": (3584, 3584, 512, 18944, 28, 152064),
}


def _layers(hidden: int, nq: int, nkv: int, inter: int, layers: int):
    dev, bf = torch.device("cuda"), torch.bfloat16
    out = []
    for _ in range(layers):
        out.append({
            "qkv": torch.randn(nq + 2 * nkv, hidden, device=dev, dtype=bf) * 0.02,
            "bqkv": torch.randn(nq + 2 * nkv, device=dev, dtype=bf) * 0.02,
            "o": torch.randn(hidden, nq, device=dev, dtype=bf) * 0.02,
            "gu": torch.randn(2 * inter, hidden, device=dev, dtype=bf) * 0.02,
            "down": torch.randn(hidden, inter, device=dev, dtype=bf) * 0.02,
            "ln1": 1 + 0.1 * torch.randn(hidden, device=dev, dtype=bf),
            "ln2": 1 + 0.1 * torch.randn(hidden, device=dev, dtype=bf),
        })
    return out


def _graph_us(fn, per_call: int) -> float:
    """µs per ``per_call`` unit of ``fn`` captured in one CUDA graph (after two eager warm-ups)."""
    fn()
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return cuda_time(g.replay, 5) / per_call * 1e6


def chain_rows(name: str, m: int, ws, hidden: int, nq: int, inter: int) -> None:
    from rlforge.rollout.native.triton_fused import add_rms_norm, silu_mul
    from rlforge.rollout.native.triton_skinny import skinny_linear

    dev, bf = torch.device("cuda"), torch.bfloat16
    h0 = torch.randn(m, hidden, device=dev, dtype=bf)
    a = torch.randn(m, nq, device=dev, dtype=bf)
    delta = torch.randn(m, hidden, device=dev, dtype=bf)

    def eager() -> None:
        h, d = h0, delta
        for w in ws:
            x, h = add_rms_norm(d, w["ln1"], 1e-6, residual=h)
            F.linear(x, w["qkv"], w["bqkv"])
            x, h = add_rms_norm(F.linear(a, w["o"]), w["ln2"], 1e-6, residual=h)
            gu = F.linear(x, w["gu"])
            d = F.linear(silu_mul(gu[:, :inter], gu[:, inter:]), w["down"])

    def skinny(pdl: bool) -> None:
        h, ss = h0, None
        for w in ws:
            skinny_linear(h, w["qkv"], w["bqkv"], norm_weight=w["ln1"], eps=1e-6, norm_ss=ss, pdl=pdl)
            r = skinny_linear(a, w["o"], residual=h, pdl=pdl)
            gu = skinny_linear(r.h, w["gu"], norm_weight=w["ln2"], eps=1e-6, norm_ss=r.ss, pdl=pdl)
            r = skinny_linear(gu, w["down"], silu=True, residual=r.h, pdl=pdl)
            h, ss = r.h, r.ss

    nbytes = sum(w[k].nbytes for w in ws for k in ("qkv", "o", "gu", "down")) / len(ws)
    te = _graph_us(eager, len(ws))
    for pdl in (False, True):
        ts = _graph_us(lambda pdl=pdl: skinny(pdl), len(ws))
        print(f"| {name} | {m} | layer GEMMs + elementwise{' (PDL)' if pdl else ''} | {te:.1f} "
              f"({nbytes / te / 1e6 / SPEC_BW * 1e12:.2f}) | {ts:.1f} ({nbytes / ts / 1e6 / SPEC_BW * 1e12:.2f}) | "
              f"{te / ts:.2f} | {(te - ts) * len(ws):.0f} |", flush=True)


def gemm_rows(name: str, m: int, ws, sweep: bool, hidden: int, inter: int, head) -> None:
    from rlforge.rollout.native.triton_skinny import SkinnyConfig, default_config, skinny_linear

    dev, bf = torch.device("cuda"), torch.bfloat16
    roles = [("qkv", hidden), ("o", hidden), ("gu", hidden), ("down", inter)]
    for role, k in roles + [("head", hidden)]:
        mats = [w[role] for w in ws] if role != "head" else [head]
        x = torch.randn(m, k, device=dev, dtype=bf)
        nbytes = mats[0].nbytes
        tc = _graph_us(lambda mats=mats, x=x: [F.linear(x, w) for w in mats], len(mats))
        cfg0 = default_config(m, mats[0].shape[0], k, dev)
        td = _graph_us(lambda mats=mats, x=x, c=cfg0: [skinny_linear(x, w, config=c) for w in mats], len(mats))
        bw = lambda t, nb=nbytes: nb / t / 1e6 / SPEC_BW * 1e12  # noqa: E731
        line = (f"| {name} | {m} | {role} {tuple(mats[0].shape)} | {tc:.1f} ({bw(tc):.2f}) | {td:.1f} ({bw(td):.2f}) | "
                f"{tc / td:.2f} | default {cfg0} |")
        print(line, flush=True)
        if not sweep:
            continue
        found = []
        for bn, bk, sf, warps, stages in itertools.product((32, 64, 128), (128, 256), (0.5, 1, 2), (4,), (3, 4)):
            split = max(1, min(-(-k // bk), round(cfg0.split_k * sf * 128 / bk)))
            cfg = SkinnyConfig(bn, bk, split, warps, stages)
            try:
                t = _graph_us(lambda mats=mats, x=x, c=cfg: [skinny_linear(x, w, config=c) for w in mats], len(mats))
            except Exception as e:  # noqa: BLE001 - a setting that does not compile or fit
                print(f"|   sweep {role} {cfg}: failed {type(e).__name__} |", flush=True)
                continue
            found.append((t, cfg))
        for t, cfg in sorted(found, key=lambda f: f[0])[:4]:
            print(f"|   sweep | {m} | {role} | | {t:.1f} ({bw(t):.2f}) | {tc / t:.2f} | {cfg} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["0.5b", "7b"], choices=sorted(SHAPES))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 16, 32])
    ap.add_argument("--sweep", action="store_true", help="also time launch settings per GEMM")
    ap.add_argument("--sweep-rows", nargs="+", type=int, default=[16])
    ap.add_argument("--sweep-models", nargs="+", default=["0.5b"])
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("skinny_gemm.py: this benchmark needs a CUDA GPU")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; spec bandwidth {SPEC_BW / 1e12} TB/s")
    print("| model | M rows | what | cuBLAS path µs (frac of spec bw) | skinny µs (frac) | speed-up | "
          "saving per step, all layers µs / setting |")
    print("|---|---|---|---|---|---|---|")
    for name in args.models:
        hidden, nq, nkv, inter, layers, vocab = SHAPES[name]
        ws = _layers(hidden, nq, nkv, inter, layers)
        head = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
        for m in args.rows:
            try:
                chain_rows(name, m, ws, hidden, nq, inter)
                gemm_rows(name, m, ws, args.sweep and m in args.sweep_rows and name in args.sweep_models, hidden,
                          inter, head)
            except Exception as e:  # noqa: BLE001 - one failing shape, the others still run
                print(f"| {name} | {m} | failed: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]} |")
        del ws, head
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()

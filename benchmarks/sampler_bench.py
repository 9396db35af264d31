"""The rollout's Triton sampler (``rlforge.rollout.native.triton_sampler.fused_sample``) beside an
earlier version of the same module and the torch path, on one GPU.

    python benchmarks/sampler_bench.py [--old PATH/TO/old_triton_sampler.py]

For each ``logits: [B, 151936]`` bf16 (the Qwen2.5 vocabulary) and with/without log-probs, prints
``| sampler | B | log-probs | us | frac of spec bw |``: the median over 5 repetitions of the mean
of 20 eager calls (CUDA events, after 3 warm-ups), as the engine calls it between graph replays.
The floor is one read of the logits at the device's spec bandwidth.  ``--old`` loads another
version of the module from a file (``git show REV:rlforge/rollout/native/triton_sampler.py``), so
both run on the same logits in one process.  Before timing, every sampler's greedy pick is
checked against ``argmax`` and its log-probs against ``log_softmax``.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_roofline import spec_bandwidth  # noqa: E402
from rollout_throughput import cuda_time  # noqa: E402

from rlforge.rollout import SamplingParams  # noqa: E402
from rlforge.rollout.native.sampler import sample_with_log_probs  # noqa: E402
from rlforge.rollout.native.triton_sampler import fused_sample  # noqa: E402

VOCAB = 151936


def _load(path: str):
    spec = importlib.util.spec_from_file_location("old_triton_sampler", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fused_sample


def _torch_path(logits: torch.Tensor, temperature: float, greedy: bool, gen, with_lp: bool):
    """The torch ops of :func:`sample_with_log_probs` (its CPU path), forced on the GPU."""
    x = logits.float()
    if greedy:
        tok = x.argmax(-1)
    else:
        tok = (x / temperature - torch.empty_like(x).exponential_(generator=gen).log_()).argmax(-1)
    picked = x.gather(-1, tok[:, None]).squeeze(-1) / (1.0 if greedy else temperature)
    lp = picked - torch.logsumexp(x / (1.0 if greedy else temperature), -1) if with_lp else None
    return tok, lp, torch.isfinite(picked).all()


def sweep(batches: list[int], bw: float) -> None:
    """The new sampler's launch settings: vocabulary tile (``block``) x warps of the per-tile kernel."""
    print(f"device {torch.cuda.get_device_name()}, spec bandwidth {bw / 1e12:.2f} TB/s")
    print("| B | block | warps | us (log-probs on) | frac of spec bw |\n|---|---|---|---|---|")
    for b in batches:
        logits = (torch.randn(b, VOCAB, device="cuda") * 3).to(torch.bfloat16)
        ref_tok = logits.float().argmax(-1)
        for block in (2048, 4096, 8192, 16384):
            for warps in (2, 4, 8, 16):
                tok, _, ok = fused_sample(logits, 1.0, True, None, True, block=block, num_warps=warps)
                good = bool(ok) and torch.equal(tok, ref_tok)
                t = cuda_time(lambda x=logits, bl=block, w=warps: fused_sample(x, 1.0, False, None, True, block=bl,
                                                                               num_warps=w))
                print(f"| {b} | {block} | {warps}{'' if good else ' (WRONG greedy pick)'} | {t * 1e6:.1f} | "
                      f"{b * VOCAB * 2 / t / bw:.2f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", default=None, help="a file holding an earlier triton_sampler.py")
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 256, 1024])
    ap.add_argument("--sweep", action="store_true",
                    help="time the new sampler's vocabulary tile x warps of its per-tile kernel (log-probs on), and exit")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        ap.error("this benchmark needs a CUDA GPU (none is visible)")
    bw = spec_bandwidth(torch.cuda.get_device_name())
    if args.sweep:
        sweep(args.batch, bw)
        return
    samplers = {"new (two kernels)": fused_sample}
    if args.old:
        samplers["old (--old)"] = _load(args.old)
    samplers["torch ops"] = _torch_path
    print(f"device {torch.cuda.get_device_name()}, spec bandwidth {bw / 1e12:.2f} TB/s")
    print("| sampler | B | log-probs | us | frac of spec bw |\n|---|---|---|---|---|")
    for b in args.batch:
        logits = (torch.randn(b, VOCAB, device="cuda") * 3).to(torch.bfloat16)
        ref_tok = logits.float().argmax(-1)
        ref_lp = logits.float().log_softmax(-1).gather(-1, ref_tok[:, None]).squeeze(-1)
        for name, fn in samplers.items():
            tok, lp, ok = fn(logits, 1.0, True, None, True)
            good = bool(ok) and torch.equal(tok, ref_tok) and torch.allclose(lp, ref_lp, atol=1e-3, rtol=1e-3)
            for with_lp in (False, True):
                t = cuda_time(lambda fn=fn, w=with_lp, x=logits: fn(x, 1.0, False, None, w))
                print(f"| {name}{'' if good else ' (WRONG greedy pick or log-prob)'} | {b} | {with_lp} | "
                      f"{t * 1e6:.1f} | {b * VOCAB * 2 / t / bw:.2f} |", flush=True)
        # the engine's own entry point, as a check that it takes the Triton path
        params = SamplingParams(temperature=1.0, max_new_tokens=1)
        t = cuda_time(lambda x=logits, p=params: sample_with_log_probs(x, p, None, True))
        print(f"| sample_with_log_probs (engine entry) | {b} | True | {t * 1e6:.1f} | {b * VOCAB * 2 / t / bw:.2f} |")


if __name__ == "__main__":
    main()

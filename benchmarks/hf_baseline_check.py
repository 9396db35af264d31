"""Is a transformers baseline row slow by itself, or slowed by what ran before it in the process?

    python benchmarks/hf_baseline_check.py [--model qwen2.5-0.5b] [--batch 1024] [--cb-prompts 256]

Issue 17 found ``rollout_throughput.py``'s ``generate`` row about 3x slower than the same call in
a fresh process.  This script times, in one fresh process and on one random-weight model:

1. issue 17's plain call, ``model.generate(ids, max_new_tokens=512, min_new_tokens=512,
   do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)``, after a 1-step warm-up;
2. the benchmark's ``generate`` setup (``hf_baselines.run_setup``) on the same prompts;
3. continuous batching (the ``cb`` setup) on the first ``--cb-prompts`` prompts;
4. one native-engine run (as ``rollout_throughput.run_native``), then 1-3 again.

Each line gives tokens/s, the free and the PyTorch-reserved device memory before the call, and
the time.  Rows 1-3 before and after the native run show whether the native run slows them.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from hf_baselines import run_setup  # noqa: E402
from rollout_throughput import Workload, _positive, build, prompts, run_native  # noqa: E402


def _mem() -> str:
    free, total = torch.cuda.mem_get_info()
    return f"free {free / 2**30:.1f} GiB, reserved {torch.cuda.memory_reserved() / 2**30:.1f} GiB"


def _plain(model, ids: torch.Tensor, new: int) -> tuple[int, float]:
    kw = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0, pad_token_id=0)
    with torch.no_grad():
        model.generate(ids, max_new_tokens=1, min_new_tokens=1, **kw)
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, **kw)
        torch.cuda.synchronize()
    return int(out.shape[0] * (out.shape[1] - ids.shape[1])), time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-0.5b")
    ap.add_argument("--batch", type=_positive, default=1024)
    ap.add_argument("--new-tokens", type=_positive, default=512)
    ap.add_argument("--cb-prompts", type=_positive, default=256)
    args = ap.parse_args()
    import transformers

    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}")
    model = build(args.model)
    wl = Workload("random", prompts(args.batch, model.config.vocab_size, seed=0), np.full(args.batch, args.new_tokens))
    ids = wl.batch["input_ids"].cuda()
    lengths = wl.lengths

    def rows(when: str) -> None:
        for label, fn in (
            ("plain generate (issue 17's call)", lambda: _plain(model, ids, args.new_tokens)),
            ("run_setup generate", lambda: run_setup(model, "generate", ids, lengths)[:2]),
            (f"run_setup cb, {args.cb_prompts} prompts",
             lambda: run_setup(model, "cb", ids[: args.cb_prompts], lengths[: args.cb_prompts])[:2]),
        ):
            mem = _mem()
            try:
                tokens, sec = fn()
                print(f"| {when} | {label} | {tokens / sec:,.0f} tok/s | {sec:.1f} s | {mem} |", flush=True)
            except Exception as e:  # noqa: BLE001 - one failing row, the others still run
                print(f"| {when} | {label} | failed: {type(e).__name__}: {str(e).splitlines()[:1]} | | {mem} |",
                      flush=True)
            torch.cuda.empty_cache()

    print("| when | call | tokens/s | time | memory before |\n|---|---|---|---|---|")
    rows("fresh process")
    tokens, sec, _ = run_native(model, wl, args.batch)
    print(f"| - | native engine | {tokens / sec:,.0f} tok/s | {sec:.1f} s | {_mem()} |", flush=True)
    rows("after a native run")


if __name__ == "__main__":
    main()

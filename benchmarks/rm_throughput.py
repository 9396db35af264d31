"""Reward-model scoring throughput: rlforge's RM stage against transformers' own forward.

The model is a ``preset:NAME``-shaped ``AutoModelForSequenceClassification`` (one label) with random
weights (default ``qwen2.5-1.5b``: 28 layers, hidden 1536, vocabulary 151936), bf16 on CUDA, float32 on
CPU.  The inputs are N random token sequences with lengths drawn uniformly from [L/2, L] (seeded), so
micro-batches are padded as in a real step.  Rows:

* ``rlforge stage``: :meth:`SequenceRewardModel.score_ids` as the trainer calls it: weights moved to the
  device, micro-batched forwards, weights back to host memory (the reward model sleeps between steps);
* ``rlforge resident``: the same forwards with the weights kept on the device (no wake/sleep);
* ``transformers (baseline)``: one ``model(input_ids, attention_mask).logits`` per micro-batch, right-padded
  (transformers' own pooling at the last non-pad token), weights resident.

Each row: ``--iters`` timed iterations (after one warm-up), repeated ``--reps`` times; the table gives the
median over repetitions of scores/s (sequences scored per second), tokens/s (valid tokens per second) and
ms per iteration (one iteration = all N sequences).

    python benchmarks/rm_throughput.py [--preset qwen2.5-1.5b] [--n 64] [--len 1024] [--micro 16]
        [--iters 5] [--reps 3] [--device cuda]
    python benchmarks/rm_throughput.py --smoke      # preset:tiny, N=8, L=48, on the CPU: a check that it runs
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace

import torch
from transformers import AutoModelForSequenceClassification

from rlforge.models.presets import preset_config
from rlforge.rewards.reward_model import SequenceRewardModel


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="qwen2.5-1.5b")
    p.add_argument("--n", type=int, default=64, help="sequences per iteration (the step's batch)")
    p.add_argument("--len", type=int, default=1024, help="longest sequence (tokens); lengths in [len/2, len]")
    p.add_argument("--micro", type=int, default=16, help="reward_model.micro_batch_size_per_gpu")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per repetition (>= 5)")
    p.add_argument("--reps", type=int, default=3, help="repetitions (>= 3)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="preset:tiny, N=8, L=48, micro 4 (CPU check)")
    args = p.parse_args(argv)
    if args.smoke:
        args.preset, args.n, args.len, args.micro = "tiny", 8, 48, 4
    if args.iters < 5 or args.reps < 3:
        p.error("--iters must be >= 5 and --reps >= 3")
    return args


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, iters: int, reps: int, device: torch.device) -> list[float]:
    """Seconds per iteration, one value per repetition (after one warm-up call)."""
    fn()
    out = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        _sync(device)
        out.append((time.perf_counter() - t0) / iters)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    g = torch.Generator().manual_seed(args.seed)
    cfg = preset_config(args.preset, 1024)
    cfg.num_labels, cfg.pad_token_id = 1, 0
    torch.manual_seed(args.seed)
    model = AutoModelForSequenceClassification.from_config(cfg, dtype=dtype).eval().requires_grad_(False)
    lengths = torch.randint(max(1, args.len // 2), args.len + 1, (args.n,), generator=g).tolist()
    ids = [torch.randint(1, cfg.vocab_size, (n,), generator=g).tolist() for n in lengths]
    tokens = sum(lengths)
    rm = SequenceRewardModel(model, SimpleNamespace(pad_token_id=0), device, dtype, micro_batch_size=args.micro)

    def stage() -> None:
        rm.score_ids(ids)

    kept = SequenceRewardModel(model, SimpleNamespace(pad_token_id=0), device, dtype, micro_batch_size=args.micro)
    kept.sleep = lambda: None  # this instance keeps the weights on the device

    def resident() -> None:
        kept.wake()  # a no-op after the first call
        kept.score_ids(ids)

    @torch.no_grad()
    def baseline() -> None:
        model.to(device)
        for i in range(0, len(ids), args.micro):
            rows = ids[i: i + args.micro]
            width = max(map(len, rows))
            x = torch.zeros((len(rows), width), dtype=torch.long)
            mask = torch.zeros_like(x)
            for j, r in enumerate(rows):
                x[j, : len(r)] = torch.tensor(r)
                mask[j, : len(r)] = 1
            model(input_ids=x.to(device), attention_mask=mask.to(device)).logits.float().cpu()

    results = {"rlforge stage": _timed(stage, args.iters, args.reps, device)}
    results["rlforge resident"] = _timed(resident, args.iters, args.reps, device)
    results["transformers (baseline)"] = _timed(baseline, args.iters, args.reps, device)
    # the scores agree with the baseline (same model, same inputs)
    ours = kept.score_ids(ids)
    ref = torch.cat([model(input_ids=torch.tensor([r], device=device)).logits.float().cpu()[:, 0] for r in ids[:4]])
    err = float((ours[:4] - ref).abs().max())

    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"reward model: preset:{args.preset} sequence classification ({params:,.1f}M parameters, {dtype}), "
          f"{device}; N={args.n} sequences, lengths {min(lengths)}..{max(lengths)} ({tokens} tokens), "
          f"micro-batch {args.micro}; {args.iters} iterations x {args.reps} repetitions (median); "
          f"max |score - unpadded forward| = {err:.2e}")
    print(f"{'path':<26}{'scores/s':>12}{'tokens/s':>14}{'ms/iter':>10}{'vs baseline':>13}")
    base = statistics.median(results["transformers (baseline)"])
    for name, secs in results.items():
        s = statistics.median(secs)
        print(f"{name:<26}{args.n / s:>12.1f}{tokens / s:>14.0f}{s * 1e3:>10.1f}{base / s:>12.2f}x")


if __name__ == "__main__":
    main()

"""Host time of the native engine's bookkeeping per decode burst (CPU only, no model).

    python benchmarks/scheduler_host.py [--seqs 1024] [--prompt-len 256] [--burst 16] [--new-tokens 512]

The engine reads the device once per burst of ``max_decode_burst`` decode steps; while the host
then schedules the next burst and books the sampled tokens, the GPU waits (benchmarks/history/RESULTS-log.md,
2026-12-01 23:04 session: ~15 ms a burst of 1,024 sequences on the H200's host).  This script runs
the scheduler and block manager alone through a whole generation of ``--seqs`` sequences with
random tokens (EOS at a random position for a quarter of them) and prints the median milliseconds
per burst of ``schedule``, ``extend_for_burst`` and ``update_burst``, over 3 repetitions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from rlforge.rollout.native.block_manager import BlockManager
from rlforge.rollout.native.scheduler import Scheduler, SchedulerConfig
from rlforge.rollout.native.sequence import Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout_throughput import _positive  # noqa: E402

EOS = 2


def one_run(seqs: int, prompt_len: int, new: int, burst: int, seed: int) -> dict[str, list[float]]:
    rng = np.random.default_rng(seed)
    bm = BlockManager(seqs * -(-(prompt_len + new) // 16), 16, True)
    sched = Scheduler(SchedulerConfig(max_num_seqs=seqs, max_num_batched_tokens=65536), bm, frozenset({EOS}))
    eos_at = {i: int(rng.integers(1, new)) for i in range(seqs) if i % 4 == 0}
    for i in range(seqs):
        sched.add(Sequence(i, rng.integers(100, 1000, prompt_len).tolist(), new))
    times: dict[str, list[float]] = {"schedule": [], "extend_for_burst": [], "update_burst": []}
    while sched.has_unfinished:
        t0 = time.perf_counter()
        out = sched.schedule()
        t1 = time.perf_counter()
        if sched.is_pure_decode(out):
            k = sched.extend_for_burst(out, burst)
            t2 = time.perf_counter()
            sampled = {}
            for s in out.seqs:
                toks = rng.integers(100, 1000, k).tolist()
                e = eos_at.get(s.seq_id)
                if e is not None and len(s.output_ids) <= e < len(s.output_ids) + k:
                    toks[e - len(s.output_ids)] = EOS
                sampled[s.seq_id] = toks
            t3 = time.perf_counter()
            sched.update_burst(out, sampled)
            t4 = time.perf_counter()
            times["schedule"].append(t1 - t0)
            times["extend_for_burst"].append(t2 - t1)
            times["update_burst"].append(t4 - t3)
        else:  # a prefill step: rows whose prompt is now complete sample one token
            done = {s.seq_id: [101] for s, n in zip(out.seqs, out.num_new_tokens, strict=True)
                    if s.num_computed_tokens + n == s.num_tokens}
            sched.update_burst(out, done)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", type=_positive, default=1024)
    ap.add_argument("--prompt-len", type=_positive, default=256)
    ap.add_argument("--new-tokens", type=_positive, default=512)
    ap.add_argument("--burst", type=_positive, default=16)
    args = ap.parse_args()
    per: dict[str, list[float]] = {}
    bursts = 0
    for rep in range(3):
        t = one_run(args.seqs, args.prompt_len, args.new_tokens, args.burst, seed=rep)
        bursts = len(t["schedule"])
        for k, v in t.items():
            per.setdefault(k, []).append(statistics.median(v) * 1e3)
    print(f"{args.seqs} sequences, prompts {args.prompt_len}, up to {args.new_tokens} new tokens, bursts of "
          f"{args.burst} ({bursts} decode bursts a run); median ms per burst, min-max over 3 runs")
    print("| function | ms per burst | min | max |\n|---|---|---|---|")
    for k, v in per.items():
        print(f"| {k} | {statistics.median(v):.2f} | {min(v):.2f} | {max(v):.2f} |")
    total = [sum(x) for x in zip(*per.values(), strict=True)]
    print(f"| total | {statistics.median(total):.2f} | {min(total):.2f} | {max(total):.2f} |")


if __name__ == "__main__":
    main()

"""Checkpoint save cost: the full-state format (``actor/state.pt``, gathered on rank 0 and ``torch.save``d,
rlforge's format before sharded checkpoints) beside the sharded one (DCP, each rank writes its shards),
synchronous and asynchronous (``actor.checkpoint.async_save``).

Run on the GPU machine (7B full fine-tuning: the model in fp32 master weights plus AdamW's two moments):

    python benchmarks/checkpoint_save.py --model qwen2.5-7b --out /local/disk/ckpt-bench
    torchrun --nproc_per_node=2 benchmarks/checkpoint_save.py --model qwen2.5-7b --out /shared/ckpt-bench

CPU smoke run (a tiny model): ``python benchmarks/checkpoint_save.py --device cpu --model tiny``.

Each row saves the same FSDP2 engine state (``preset:`` model with random weights, AdamW state made by one
optimizer step) through the trainer's own code (:class:`rlforge.trainer.checkpointer.Checkpointer`):
  full        ``engine.state_dict()`` (full gather to rank 0's host memory) then ``torch.save`` (the old format)
  dcp         each rank's shards written by ``dcp.save``; training waits for the write
  dcp-async   ``dcp.async_save``: the shards copied to host memory (pinned on CUDA), written by a thread
Reported per row: ``blocked_s``, the time training waits (the ``save`` call; the trainer logs it as
``timing_s/save_checkpoint``); ``total_s``, until the checkpoint is committed (manifest hashed, renamed, the
tracker file written); ``peak_host_gb``, rank 0's peak resident memory during the row above its level
before the row (sampled every 10 ms); ``disk_gb``.  Without torchrun each row runs in a fresh process, so
one row's freed memory does not hide the next one's peak; under torchrun the rows run one after another
in the same processes (the later rows' peaks can then read low).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = ("full", "dcp", "dcp-async")


def rss_gb() -> float:
    """This process's resident memory in GB (``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9


class PeakRss:
    """The peak of :func:`rss_gb` above its level at entry, sampled every 10 ms by a thread."""

    def __enter__(self) -> PeakRss:
        self.base = self.peak = rss_gb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.01):
            self.peak = max(self.peak, rss_gb())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_gb())

    @property
    def above_gb(self) -> float:
        return self.peak - self.base


def build_engine(model_name: str, device: str):
    """An FSDP2 engine on ``preset:model_name`` (random weights) with its AdamW state made by one step."""
    import torch

    from rlforge.config import ActorConfig
    from rlforge.engine import ENGINES
    from rlforge.engine.distributed import init_distributed, init_single_process
    from rlforge.models import load_causal_lm, load_tokenizer

    dev = torch.device(device)
    info = init_distributed(device) if "WORLD_SIZE" in os.environ else init_single_process(dev)
    tok = load_tokenizer("preset:tiny", "builtin:integers")
    model = load_causal_lm(f"preset:{model_name}", tok, seed=0)
    engine = ENGINES.get("fsdp2")(model, info.device, optim_cfg=ActorConfig().optim, total_steps=10)
    for p in engine.module.parameters():
        p.grad = torch.full_like(p, 1e-3)
    engine.optimizer.step()
    engine.optimizer.zero_grad(set_to_none=True)
    return engine, info


def run_row(row: str, model_name: str, device: str, out: Path) -> dict:
    """One row's numbers (rank 0's; every rank runs it)."""
    from rlforge.trainer import checkpoint as ckpt
    from rlforge.trainer.checkpointer import Checkpointer, Role

    engine, info = build_engine(model_name, device)
    root = out / row
    if info.rank == 0:
        shutil.rmtree(root, ignore_errors=True)
    saver = Checkpointer(info.rank)
    with PeakRss() as mem:
        start = time.perf_counter()
        if row == "full":
            full = engine.state_dict()
            if info.rank == 0:
                ckpt.save_checkpoint(root, 1, {"actor": full, "trainer_state": {"global_step": 1}})
            del full
        else:
            saver.save(root, 1, {"actor": Role(engine, async_save=row == "dcp-async")}, {"global_step": 1})
        blocked = time.perf_counter() - start
        saver.close()
        total = time.perf_counter() - start
    disk = sum(p.stat().st_size for p in (root / "global_step_1").rglob("*") if p.is_file()) / 1e9 \
        if info.rank == 0 else 0.0
    return {"row": row, "blocked_s": blocked, "total_s": total, "peak_host_gb": mem.above_gb, "disk_gb": disk,
            "world": info.world_size}


def print_table(model_name: str, device: str, results: list[dict]) -> None:
    print(f"\ncheckpoint save, preset:{model_name} (fp32 weights + AdamW), {device}, "
          f"{results[0]['world']} rank(s)")
    print(f"{'format':<10} {'blocked_s':>10} {'total_s':>9} {'peak_host_gb':>13} {'disk_gb':>8}")
    for r in results:
        print(f"{r['row']:<10} {r['blocked_s']:>10.3f} {r['total_s']:>9.3f} {r['peak_host_gb']:>13.3f} "
              f"{r['disk_gb']:>8.3f}")
    print("blocked_s: training waits (timing_s/save_checkpoint); total_s: until committed; peak_host_gb: rank 0's "
          "resident memory above its level before the row")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-7b", help="a preset of rlforge.models.presets (tiny on CPU)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    ap.add_argument("--out", default="outputs/checkpoint_bench", help="where the checkpoints are written")
    ap.add_argument("--keep", action="store_true",
                    help="keep each row's checkpoint (default: removed after the row, so a disk that holds one fits)")
    ap.add_argument("--one-row", default=None, help=argparse.SUPPRESS)  # a child process: one row, JSON out
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.one_row:
        print("RESULT " + json.dumps(run_row(args.one_row, args.model, args.device, out)), flush=True)
        return 0
    if "WORLD_SIZE" in os.environ:  # under torchrun: the rows in turn, in these processes
        results = []
        for row in args.rows:
            results.append(run_row(row, args.model, args.device, out))
            if not args.keep and int(os.environ.get("RANK", "0")) == 0:
                shutil.rmtree(out / row, ignore_errors=True)
        if int(os.environ.get("RANK", "0")) == 0:
            print_table(args.model, args.device, results)
        return 0
    results = []
    for row in args.rows:  # a fresh process per row: its peak memory is its own
        res = subprocess.run([sys.executable, __file__, "--model", args.model, "--device", args.device,
                              "--out", str(out), "--one-row", row], capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stderr[-3000:], file=sys.stderr)
            return res.returncode
        line = next(ln for ln in res.stdout.splitlines() if ln.startswith("RESULT "))
        results.append(json.loads(line[len("RESULT "):]))
        if not args.keep:
            shutil.rmtree(out / row, ignore_errors=True)
    print_table(args.model, args.device, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

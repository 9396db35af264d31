"""Actor-update throughput of parallel layouts on 2 GPUs: FSDP2 DP=2 vs TP=2 vs PP=2.

Run on the 2-GPU machine (nvidia-h200-x2) with plain ``python``:

    python benchmarks/parallel_layouts.py --model qwen2.5-1.5b qwen2.5-7b

Started without torchrun (no ``WORLD_SIZE``), the script is a launcher: for every model and
row it runs ``python -m torch.distributed.run --standalone --nproc_per_node=<--nproc>`` on
itself with that one model and row, waits at most ``--row-timeout`` seconds (then the row
reads ``timeout``; a failed child reads ``failed (see log)``, an out-of-memory one ``out of
memory``), writes each child's whole output to ``--log-dir`` (``<model>_<row>.log``) and
prints one table per model at the end.  One process group per row, as a user's job has:
every engine creates its own process groups (device meshes, TP/PP groups, P2P
communicators) that live until the process ends, its memory comes back only after a garbage
collection (the engines hold reference cycles), and when one rank fails (e.g. out of memory, which the other rank's data may not
hit) the other rank stays inside a collective, so in a shared process one row's failure
hangs or corrupts the rows after it.  Two runs that mixed FSDP2 and megatron rows in one
process hung on the H200 machine (not reproduced on CPU with gloo).

Under torchrun the script runs all given models and rows in one process group (as before):

    torchrun --nproc_per_node=2 benchmarks/parallel_layouts.py --model qwen2.5-1.5b --rows fsdp2-ckpt

There an out-of-memory error ends the run (the rank prints ``out of memory`` and exits, and
torchrun stops the others) instead of leaving the ranks in different rows.  On a machine
without CUDA the ranks use gloo on the CPU (a smoke run: ``--model tiny``).

The workload is benchmarks/train_throughput.py's (its ``make_batch``): ``--seqs`` sequences per
GPU, each a 128-token prompt and a long-tailed response (log-normal, 64..2048 tokens), random
weights, fp32 master weights and bf16 compute, the real PPO loss, one optimizer step per
``train_step``.  Every layout processes the same rows: under TP and PP the two GPUs hold one
model copy and the engine gathers both GPUs' rows.

Rows (``--rows``), each ``LAYOUT`` or ``LAYOUT-ckpt`` (gradient checkpointing):
  fsdp2     FSDP2 DP=2, token-budget micro-batches, padding-free packed forward
            (train_throughput.py's ``fsdp2-dyn``)
  fsdp2pad  FSDP2 DP=2, token-budget micro-batches, padded forward (what TP/PP run)
  tp2       strategy=megatron TP=2 with sequence parallelism (DTensor), vocabulary-parallel head
  tp2nosp   TP=2 without sequence parallelism
  pp2       strategy=megatron PP=2, Schedule1F1B
  pp2v2     PP=2 with 2 virtual stages per GPU, ScheduleInterleaved1F1B

Columns: step time (median of ``--iters``), tokens/s over both GPUs (valid tokens), MFU (model
FLOPs of the valid tokens, attention included, over the peak of both GPUs), peak allocated
memory (the larger GPU), the number of micro-batches per model copy and, for PP, the measured
pipeline bubble (``parallel/pp_bubble``: the fraction of the schedule step a GPU was not
computing, averaged over the GPUs; stages are split by layer count, so the last stage also
carries the LM head and the first the embedding).
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import NoReturn

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import _stack_dumps, _sync, make_batch, set_attention  # noqa: E402

from rlforge.config import ActorConfig, FSDPConfig, MegatronConfig, OptimConfig  # noqa: E402
from rlforge.engine import ENGINES  # noqa: E402
from rlforge.engine.distributed import all_reduce_max, all_reduce_sum, init_distributed  # noqa: E402
from rlforge.models import load_causal_lm, load_tokenizer  # noqa: E402
from rlforge.perf.flops import device_peak_flops, forward_flops  # noqa: E402
from rlforge.roles.actor import Actor  # noqa: E402

DEFAULT_ROWS = "fsdp2-ckpt,fsdp2pad-ckpt,tp2-ckpt,pp2-ckpt"
LAYOUTS = {  # name -> (strategy, megatron sizes, packed forward)
    "fsdp2": ("fsdp2", {}, True),
    "fsdp2pad": ("fsdp2", {}, False),
    "tp2": ("megatron", {"tensor_model_parallel_size": 2}, False),
    "tp2nosp": ("megatron", {"tensor_model_parallel_size": 2, "sequence_parallel": False}, False),
    "pp2": ("megatron", {"pipeline_model_parallel_size": 2}, False),
    "pp2v2": ("megatron", {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2}, False),
}
HEADER = (f"{'layout':<16} {'step s':>8} {'tokens/s':>10} {'MFU':>7} {'peak GB':>8} {'micro':>6} {'bubble':>7} "
          f"{'nccl ms':>8} {'busy ms':>8} {'idle':>6}")
OOM_EXIT = 3  # exit status of a worker that ran out of memory


def build_engine(row: str, base: torch.nn.Module, device: torch.device, attn: str = ""):
    layout, *flags = row.split("-")
    strategy, sizes, packed = LAYOUTS[layout]
    module = copy.deepcopy(base)
    if packed and attn:
        set_attention(module, attn)
    engine = ENGINES.get(strategy)(
        module, device, fsdp_config=FSDPConfig(forward_prefetch=True),
        megatron_config=MegatronConfig(**sizes), role_key="actor_rollout_ref.actor", optim_cfg=OptimConfig(lr=1e-6),
        total_steps=100, optim_key="optim", grad_clip=1.0, gradient_checkpointing="ckpt" in flags,
    )
    return engine, packed


def run_row(row: str, base: torch.nn.Module, batch, args, device, world: int) -> dict:
    engine, packed = build_engine(row, base, device, args.attn)
    actor = Actor(engine, ActorConfig(ppo_mini_batch_size=len(batch), ppo_epochs=1), len(batch), len(batch),
                  len(batch), max_token_len=args.budget, remove_padding=packed)
    loss_fn = actor._loss_fn(1.0)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    times, bubbles, micros = [], [], []
    fsdp_micros = _fsdp_micro_batches(batch, args.budget)  # a collective: every rank, every row
    for i in range(args.warmup + args.iters):
        _sync()
        dist.barrier()
        t0 = time.perf_counter()
        engine.train_step(batch, loss_fn, len(batch), args.budget)
        _sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            m = engine.metrics()
            bubbles.append(m.get("parallel/pp_bubble", 0.0))
            micros.append(m.get("parallel/num_micro_batches", fsdp_micros))
    t = float(all_reduce_max([float(np.median(times))], device)[0])
    prof = _profiled_step(engine, batch, loss_fn, args, row) if args.profile else {}
    seqlens = batch["attention_mask"].sum(-1).tolist()
    tokens, flops = all_reduce_sum([float(sum(seqlens)), 3.0 * forward_flops(base.config, seqlens)], device)
    peak = device_peak_flops(device) or 989e12
    mem = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0
    out = {"row": row, "time_s": t, "tokens_per_s": tokens / t, "mfu": flops / t / (peak * world),
           "peak_mem_gb": all_reduce_max([mem], device)[0],
           "bubble": all_reduce_sum([float(np.mean(bubbles))], device)[0] / world,
           "micro": int(round(np.mean(micros))), **prof}
    del engine, actor, loss_fn
    gc.collect()  # the FSDP2 and pipeline engines sit in reference cycles: `del` alone frees nothing
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def _profiled_step(engine, batch, loss_fn, args: argparse.Namespace, row: str) -> dict:
    """One more (untimed) step under ``torch.profiler`` on every rank; rank 0 writes its
    Chrome trace to ``--log-dir`` and returns what the trace says about it: GPU time in NCCL
    kernels (communication not hidden or hidden behind compute alike), GPU busy time and the
    idle fraction of the step (:mod:`rlforge.perf.torch_trace`)."""
    from torch.profiler import ProfilerActivity, profile

    from rlforge.perf.torch_trace import summarize

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    _sync()
    dist.barrier()
    with profile(activities=acts) as prof:
        engine.train_step(batch, loss_fn, len(batch), args.budget)
        _sync()
    if dist.get_rank() != 0:
        return {}
    path = Path(args.log_dir) / f"trace_{_safe(args.model[0])}_{_safe(row)}_rank0.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    summ = summarize(path, num_gaps=3, top_kernels=5)
    nccl = next((c.total_ms for c in summ.categories if c.name == "nccl"), 0.0)
    return {"nccl_ms": nccl, "busy_ms": summ.busy_ms, "idle": summ.idle_fraction}


def _fsdp_micro_batches(batch, budget: int) -> int:
    """Token-budget micro-batches of each FSDP rank: the count synchronised over the ranks
    (the engine's own split; a collective)."""
    from rlforge.engine.dynamic_batch import split_by_token_budget

    return len(split_by_token_budget(batch, budget, "--budget")[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Actor-update throughput of FSDP2 / TP / PP layouts (see the docstring).")
    p.add_argument("--model", nargs="+", default=["qwen2.5-1.5b", "qwen2.5-7b"])
    p.add_argument("--rows", default=DEFAULT_ROWS)
    p.add_argument("--seqs", type=int, default=64, help="sequences per GPU per optimizer step")
    p.add_argument("--budget", type=int, default=16384, help="token budget of one micro-batch")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the default model's)")
    p.add_argument("--profile", action="store_true",
                   help="one extra step per row under torch.profiler: NCCL kernel ms, GPU busy ms and idle fraction "
                        "of rank 0 (its trace goes to --log-dir)")
    p.add_argument("--attn", default="rlforge_varlen", choices=("rlforge_varlen", "flex_attention", "sdpa", ""),
                   help="attention of the packed FSDP2 rows (rlforge_varlen, flex_attention, sdpa)")
    launcher = p.add_argument_group("launcher (without torchrun)")
    launcher.add_argument("--nproc", type=int, default=2, help="processes (GPUs) per row")
    launcher.add_argument("--row-timeout", type=float, default=600.0, help="seconds one row may take")
    p.add_argument("--log-dir", default="parallel_layouts_logs", help="where each row's output (and trace) goes")
    args = p.parse_args(argv)
    from rlforge.models.presets import PRESETS

    for row in args.rows.split(","):
        layout, *flags = row.split("-")
        if layout not in LAYOUTS or not set(flags) <= {"ckpt"}:
            p.error(f"--rows: unknown row {row!r} (valid: {', '.join(LAYOUTS)}, each optionally with -ckpt)")
    unknown = [m for m in args.model if m not in PRESETS]
    if unknown:
        p.error(f"--model: unknown preset(s) {unknown}; valid: {', '.join(PRESETS)}")
    for name in ("iters", "seqs", "budget", "nproc"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if not args.row_timeout > 0:
        p.error(f"--row-timeout must be > 0 seconds, got {args.row_timeout}")
    if Path(args.log_dir).exists() and not Path(args.log_dir).is_dir():
        p.error(f"--log-dir {args.log_dir}: exists and is not a folder")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if "WORLD_SIZE" not in os.environ:
        return launch(args)
    _stack_dumps()
    return worker(args)


# ---------------------------------------------------------------------- under torchrun
def worker(args: argparse.Namespace) -> int:
    """All models and rows of ``args`` in this process group; rank 0 prints the table."""
    info = init_distributed("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke run only
    rank, world, device = info.rank, info.world_size, info.device
    tok = load_tokenizer("preset:tiny", args.tokenizer)
    for model_name in args.model:
        base = load_causal_lm(f"preset:{model_name}", tok, seed=0)
        batch = make_batch(base.config.vocab_size, args.seqs, seed=rank, eos=tok.eos_token_id, pad=tok.pad_token_id)
        if rank == 0:
            lens = batch["attention_mask"].sum(-1)
            print(f"\n{model_name}: {world} GPU(s), {args.seqs} seqs/GPU, valid tokens/GPU {int(lens.sum())}, "
                  f"padded {batch['input_ids'].numel()}, max len {int(lens.max())}, budget {args.budget}", flush=True)
            print(HEADER, flush=True)
        for row in args.rows.split(","):
            try:
                r = run_row(row, base, batch, args, device, world)
            except torch.OutOfMemoryError as e:
                _out_of_memory(row, rank, e)
            if rank == 0:
                prof = (f" {r['nccl_ms']:>8.0f} {r['busy_ms']:>8.0f} {r['idle']:>6.1%}" if r.get("idle") is not None
                        else f" {'-':>8} {'-':>8} {'-':>6}")
                print(f"{row:<16} {r['time_s']:>8.3f} {r['tokens_per_s']:>10.0f} {r['mfu']:>7.1%} "
                      f"{r['peak_mem_gb']:>8.1f} {r['micro']:>6d} {r['bubble']:>7.1%}{prof}", flush=True)
        del base
    dist.destroy_process_group()
    return 0


def _out_of_memory(row: str, rank: int, err: BaseException) -> NoReturn:
    """End the process: the other ranks may be inside a collective this rank will never join,
    so going on to the next row would pair its collectives with theirs (a hang or garbage).
    torchrun then stops the other ranks."""
    if rank == 0:
        print(f"{row:<16} out of memory", flush=True)
    print(f"[rank {rank}] {row}: out of memory, exiting ({str(err).splitlines()[0] if str(err) else ''})",
          file=sys.stderr, flush=True)
    os._exit(OOM_EXIT)


# ---------------------------------------------------------------------- launcher
_FORWARDED = ("seqs", "budget", "warmup", "iters", "tokenizer", "attn", "log_dir")  # options passed on to each row


def launch(args: argparse.Namespace) -> int:
    """One ``torchrun`` per model and row (see the module docstring); prints one table per
    model.  Returns 1 when a row failed or timed out, else 0."""
    log_dir = Path(args.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    rows = args.rows.split(",")
    base_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
                os.path.abspath(__file__)]
    for name in _FORWARDED:
        if getattr(args, name) is not None:
            base_cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    if args.profile:
        base_cmd.append("--profile")
    tables: dict[str, tuple[str, list[str]]] = {}
    all_ok = True
    for model in args.model:
        title, lines = f"{model}:", []
        for row in rows:
            log = log_dir / f"{_safe(model)}_{_safe(row)}.log"
            t0 = time.perf_counter()
            line, head, ok = _run_row_child([*base_cmd, "--model", model, "--rows", row], row, model, log,
                                            args.row_timeout)
            all_ok &= ok
            title = head or title
            lines.append(line)
            print(f"[{model} {row}] {' '.join(line.split()[1:])}  ({time.perf_counter() - t0:.0f} s, log {log})",
                  file=sys.stderr, flush=True)
        tables[model] = (title, lines)
    for title, lines in tables.values():
        print(f"\n{title}\n{HEADER}", flush=True)
        for line in lines:
            print(line, flush=True)
    print(f"\nlogs: {log_dir}/", flush=True)
    return 0 if all_ok else 1


def _run_row_child(cmd: list[str], row: str, model: str, log: Path, timeout: float) -> tuple[str, str | None, bool]:
    """Run ``cmd`` (its own process group) with stdout and stderr into ``log``.

    Returns ``(table line, the model's title line or None, ok)``; the table line is rank 0's,
    or ``<row> timeout`` / ``out of memory`` / ``failed (see log)``."""
    timed_out = False
    with log.open("w") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            rc = _stop(proc)
    text = log.read_text(errors="replace")
    title = next((ln for ln in text.splitlines() if ln.startswith(f"{model}: ")), None)
    found = next((ln for ln in text.splitlines() if ln.split()[:1] == [row]), None)
    if timed_out:
        return f"{row:<16} timeout", title, False
    if found is not None:  # rank 0's result (or its "out of memory"), even if the child failed afterwards
        return found, title, rc == 0 or "out of memory" in found
    if "out of memory" in text:
        return f"{row:<16} out of memory", title, True
    return f"{row:<16} failed (see log)", title, False


def _stop(proc: subprocess.Popen) -> int:
    """SIGTERM torchrun (it stops its workers, which dump their stacks into the log first), then
    SIGKILL torchrun and the workers it started (their own sessions) if they are still there."""
    pids = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=60.0)
    except subprocess.TimeoutExpired:
        pass
    for pid in [*pids, proc.pid]:  # torchrun did not stop them itself
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return proc.wait()


def _descendants(pid: int) -> list[int]:
    """Child processes of ``pid``, recursively (Linux ``/proc``; empty elsewhere)."""
    out: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in map(int, children.read_text().split()):
            out += [child, *_descendants(child)]
    return out


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


if __name__ == "__main__":
    sys.exit(main())

"""Actor-update throughput of parallel layouts on 2 GPUs: FSDP2 DP=2 vs TP=2 vs PP=2.

Run on the 2-GPU machine (nvidia-h200-x2), one process per GPU:

    torchrun --nproc_per_node=2 benchmarks/parallel_layouts.py --model qwen2.5-1.5b qwen2.5-7b

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
import faulthandler
import os
import signal
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_throughput import _sync, make_batch, set_attention  # noqa: E402

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
            micros.append(m.get("parallel/num_micro_batches", _fsdp_micro_batches(batch, args.budget)))
    t = float(all_reduce_max([float(np.median(times))], device)[0])
    seqlens = batch["attention_mask"].sum(-1).tolist()
    tokens, flops = all_reduce_sum([float(sum(seqlens)), 3.0 * forward_flops(base.config, seqlens)], device)
    peak = device_peak_flops(device) or 989e12
    mem = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0
    out = {"row": row, "time_s": t, "tokens_per_s": tokens / t, "mfu": flops / t / (peak * world),
           "peak_mem_gb": all_reduce_max([mem], device)[0],
           "bubble": all_reduce_sum([float(np.mean(bubbles))], device)[0] / world,
           "micro": int(round(np.mean(micros)))}
    del engine, actor
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def _fsdp_micro_batches(batch, budget: int) -> int:
    """Token-budget micro-batches of one FSDP rank (its own rows)."""
    from rlforge.engine.dynamic_batch import token_budget_partition

    return len(token_budget_partition(batch["attention_mask"].sum(-1).tolist(), budget))


def _stack_dumps() -> None:
    """Stall diagnosis: every process prints all threads' stacks when stopped by SIGTERM
    (``timeout``, torchrun) and, with ``RLFORGE_STACK_DUMP_S=N``, every N seconds."""
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    every = int(os.environ.get("RLFORGE_STACK_DUMP_S", "0") or 0)
    if every > 0:
        faulthandler.dump_traceback_later(every, repeat=True)


def main() -> int:
    _stack_dumps()
    p = argparse.ArgumentParser()
    p.add_argument("--model", nargs="+", default=["qwen2.5-1.5b", "qwen2.5-7b"])
    p.add_argument("--rows", default=DEFAULT_ROWS)
    p.add_argument("--seqs", type=int, default=64, help="sequences per GPU per optimizer step")
    p.add_argument("--budget", type=int, default=16384, help="token budget of one micro-batch")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the default model's)")
    p.add_argument("--attn", default="rlforge_varlen",
                   help="attention of the packed FSDP2 rows (rlforge_varlen, flex_attention, sdpa)")
    args = p.parse_args()
    if "WORLD_SIZE" not in os.environ:
        print("run with torchrun --nproc_per_node=2", file=sys.stderr)
        return 2
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
            print(f"{'layout':<16} {'step s':>8} {'tokens/s':>10} {'MFU':>7} {'peak GB':>8} {'micro':>6} "
                  f"{'bubble':>7}", flush=True)
        for row in args.rows.split(","):
            try:
                r = run_row(row, base, batch, args, device, world)
                line = (f"{row:<16} {r['time_s']:>8.3f} {r['tokens_per_s']:>10.0f} {r['mfu']:>7.1%} "
                        f"{r['peak_mem_gb']:>8.1f} {r['micro']:>6d} {r['bubble']:>7.1%}")
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                line = f"{row:<16} out of memory"
            if rank == 0:
                print(line, flush=True)
        del base
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

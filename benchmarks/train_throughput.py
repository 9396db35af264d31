"""Actor-update throughput: fixed vs token-budget micro-batches, checkpointing, activation
offload, FSDP2 on 1 and 2 GPUs.

Run on the GPU machine, one process per GPU:

    torchrun --nproc_per_node=1 benchmarks/train_throughput.py --model qwen2.5-0.5b qwen2.5-1.5b
    torchrun --nproc_per_node=2 benchmarks/train_throughput.py --model qwen2.5-1.5b --rows fsdp2-dyn

Each row times ``Actor.update``-style optimizer steps (``TrainEngine.train_step`` with the
real PPO loss) on a batch of ``--seqs`` sequences per GPU.  Each sequence is a 128-token
prompt and a response whose length comes from a long-tailed mix (log-normal, clipped to
64..2048).  The model is a ``preset:`` with random weights, fp32 master weights and bf16
compute.  Reported per row: tokens/s summed over all GPUs (valid tokens only; step time of the slowest rank), MFU (model FLOPs
of the valid tokens, attention included, over the H200's 989 TFLOP/s bf16 peak per GPU) in three
conventions side by side (``rlforge.perf.flops``: ours, verl's ``FlopsCounter``, and HFU, which
counts checkpointing's recomputed forward and the chunked head's recompute), and peak allocated
memory per GPU.  Without ``torchrun`` the process joins a one-rank group in-process
(``init_single_process``), as ``rlforge train`` does.

Rows (``--rows``):
  fixed-K     K rows per micro-batch, padded to the longest sequence of the batch
  fixedrm-K   K rows per micro-batch with the padding-free (packed) forward
  dyn         token-budget micro-batches (``--budget`` tokens) with the packed forward
  dyn-ckpt    dyn with gradient checkpointing
  dyn-offload dyn with activation offload
  dyn-ckpt-offload  both
  Every row runs the FSDP2 engine (on 1 GPU, or on every GPU under torchrun): the engine
  ``rlforge train`` builds for ``strategy=fsdp2``, on one device too.  An ``fsdp2-`` prefix
  (``fsdp2-dyn``, as in older command lines) changes nothing; the rows without it ran the
  single-process engine, since removed, in the dated log before 2026-12-03.
  Further ``-`` tokens (any order) on any row: ``ckpt`` gradient checkpointing, ``offload``
  activation offload, ``compile`` regional torch.compile of each layer's MLP and norms
  (``actor.use_torch_compile``), ``optoff`` optimizer offload (``fsdp_config.optimizer_offload``),
  ``nopf`` FSDP2 without explicit prefetch, ``nrs`` FSDP2 with
  ``fsdp_config.reshard_after_forward=false``, ``liger`` liger-kernel's RMSNorm/SwiGLU/RoPE
  (``model.use_liger``; its RoPE patch is process-wide, so put ``liger`` rows last), ``torchhead``
  the chunked head's plain-torch chunks (``fused_kernel_options.impl_backend=torch``; the other rows
  run its default, the Triton chunk kernels on CUDA).
  e.g. ``fsdp2-dyn-ckpt-compile``.

Log-prob implementation (``--head``, each row runs once per entry, side by side):
  chunked     the chunked LM head (``use_fused_kernels``, the default; ``--chunk-size`` positions
              per chunk): the model runs without its head, log-probs/entropy come from the
              response positions' hidden states, never a (tokens, vocab) logits tensor
  plain       the model's full logits over every position, then log-softmax (the old path)

``--profile`` runs torch.profiler over one more step of every row and prints the 15 GPU
kernels with the most total time (name, calls, total ms, % of the step's wall time) and the
step's peak allocated memory (on CPU: the 15 ops with the most self CPU time).
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

from rlforge.batch import Batch
from rlforge.config import ActorConfig, FSDPConfig, FusedKernelOptions, OptimConfig
from rlforge.engine import ENGINES
from rlforge.engine.distributed import all_reduce_max, all_reduce_sum, init_distributed, init_single_process
from rlforge.models import load_causal_lm, load_tokenizer
from rlforge.perf.flops import device_peak_flops, train_flops
from rlforge.roles.actor import Actor
from rlforge.roles.fused_head import set_impl_backend
from rlforge.rollout.base import assemble

PROMPT_LEN = 128
DEFAULT_ROWS = "fixed-2,fixed-4,fixed-8,fixedrm-4,fixedrm-8,dyn,dyn-ckpt,dyn-offload,dyn-ckpt-offload"


def response_lengths(n: int, seed: int) -> list[int]:
    """Long-tailed lengths: log-normal around ~300 tokens, clipped to 64..2048."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(mean=5.7, sigma=0.9, size=n), 64, 2048).astype(int).tolist()


def make_batch(vocab: int, n: int, seed: int, eos: int, pad: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    lens = response_lengths(n, seed)
    r_max = max(lens)
    ids = torch.randint(100, vocab - 1, (n, PROMPT_LEN), generator=g)
    prompts = Batch.from_dict({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                               "position_ids": torch.arange(PROMPT_LEN).expand(n, -1).clone()})
    resp = torch.randint(100, vocab - 1, (n, r_max), generator=g)
    for i, L in enumerate(lens):
        if L < r_max:
            resp[i, L - 1] = eos
    b = assemble(prompts, resp, [eos], pad)
    mask = b["response_mask"].float()
    b["old_log_probs"] = -5.0 * mask
    b["advantages"] = torch.randn(mask.shape, generator=g) * mask
    return b


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _kernel_table(prof, cuda: bool, n: int = 15) -> list[tuple[str, int, float]]:
    """``(name, calls, total ms)`` of the ``n`` GPU kernels (CPU: ops by self time) with the most time."""
    if not cuda:
        avgs = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)[:n]
        return [(e.key, e.count, e.self_cpu_time_total / 1e3) for e in avgs]
    from torch.autograd import DeviceType

    acc: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            t = acc.setdefault(e.name, [0, 0.0])
            t[0] += 1
            t[1] += e.time_range.elapsed_us() / 1e3
    top = sorted(acc.items(), key=lambda kv: kv[1][1], reverse=True)[:n]
    return [(name, int(c), ms) for name, (c, ms) in top]


def profile_step(label: str, step, step_args: tuple, rank: int) -> None:
    """One ``step(*step_args)`` under torch.profiler; rank 0 prints the kernel table and peak memory."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    _sync()
    with profile(activities=acts) as prof:
        t0 = time.perf_counter()
        step(*step_args)
        _sync()
        wall_ms = (time.perf_counter() - t0) * 1e3
    if rank != 0:
        return
    peak = torch.cuda.max_memory_allocated() / 1e9 if cuda else 0.0
    table = _kernel_table(prof, cuda)
    busy = sum(ms for _, _, ms in _kernel_table(prof, cuda, n=10**9))
    print(f"\n  profile {label}: step {wall_ms:.0f} ms (under the profiler), peak {peak:.1f} GB, "
          f"{'GPU kernels' if cuda else 'CPU ops'} {busy:.0f} ms in all", flush=True)
    print(f"  {'kernel' if cuda else 'op':<90} {'calls':>6} {'total ms':>9} {'% step':>7}", flush=True)
    for name, calls, ms in table:
        print(f"  {name[:90]:<90} {calls:>6} {ms:>9.1f} {ms / wall_ms:>7.1%}", flush=True)
    print(flush=True)
    if cuda:  # the same step by kernel category, and its longest GPU idle gaps with what the CPU was doing
        from rlforge.perf.torch_trace import render_markdown, summarize

        trace = f"train_profile_{''.join(c if c.isalnum() else '_' for c in label)}.json"
        prof.export_chrome_trace(trace)
        print(render_markdown(summarize(trace, num_gaps=8, top_kernels=10, min_gap_ms=0.5), level=2), flush=True)


def set_attention(module: torch.nn.Module, attn: str) -> None:
    """The packed rows' attention: ``rlforge_varlen`` (torch's varlen flash kernel on cu_seqlens,
    what ``rlforge train`` picks on CUDA), ``flex_attention`` (block-sparse document masks,
    compiled) or ``sdpa`` (a dense block-diagonal mask over the packed row)."""
    if attn == "rlforge_varlen":
        from rlforge.engine.varlen import register

        register()
    module.set_attn_implementation(attn)


def run_row(row: str, head: str, base_model: torch.nn.Module, batch: Batch, args, device, world: int,
            rank: int) -> dict:
    parts = row.split("-")
    dyn = "dyn" in parts
    remove_padding = dyn or parts[0] == "fixedrm"
    micro = int(parts[1]) if parts[0] in ("fixed", "fixedrm") else len(batch)
    name = "fsdp2"  # every row: the engine `rlforge train` builds for strategy=fsdp2, on one device too
    module = copy.deepcopy(base_model)
    if remove_padding and args.attn:
        set_attention(module, args.attn)
    set_impl_backend("torch" if "torchhead" in parts else "triton")
    if "liger" in parts:
        from rlforge.engine.liger import apply_liger

        if not apply_liger(module, device):
            raise SystemExit(f"row {row}: liger-kernel is not installed or this is not a CUDA device")
    optim = OptimConfig(lr=1e-6)
    fsdp_cfg = FSDPConfig(forward_prefetch="nopf" not in parts, optimizer_offload="optoff" in parts,
                          reshard_after_forward="nrs" not in parts)
    engine = ENGINES.get(name)(
        module, device, fsdp_config=fsdp_cfg, optim_cfg=optim, total_steps=100,
        optim_key="optim", grad_clip=1.0, gradient_checkpointing="ckpt" in parts, activation_offload="offload" in parts,
        compile_layers="compile" in parts,
    )
    cfg = ActorConfig(ppo_mini_batch_size=len(batch), ppo_epochs=1)
    actor = Actor(engine, cfg, len(batch), micro, micro, max_token_len=args.budget if dyn else None,
                  remove_padding=remove_padding, head_chunk_size=args.chunk_size if head == "chunked" else 0)
    loss_fn = actor._loss_fn(1.0)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    times = []
    for i in range(args.warmup + args.iters):
        _sync()
        t0 = time.perf_counter()
        engine.train_step(batch, loss_fn, micro, args.budget if dyn else None)
        _sync()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    peak_mem = torch.cuda.max_memory_allocated() / 1e9 if torch.cuda.is_available() else 0.0
    if args.profile:
        profile_step(f"{row} {head}", engine.train_step, (batch, loss_fn, micro, args.budget if dyn else None), rank)
    seqlens = batch["attention_mask"].sum(-1).tolist()
    t, peak_mem = (float(x) for x in all_reduce_max([float(np.median(times)), peak_mem], device))  # slowest rank
    chunked = head == "chunked"
    head_tokens = float(batch["response_mask"].sum()) if chunked else None
    per_conv = [train_flops(base_model.config, seqlens, c, recompute="ckpt" in parts, head_tokens=head_tokens,
                            head_recompute=chunked) for c in ("rlforge", "verl", "hfu")]
    tokens, *flops = all_reduce_sum([float(sum(seqlens)), *per_conv], device)
    peak = device_peak_flops(device) or 989e12
    out = {"row": row, "time_s": t, "tokens_per_s": tokens / t, "mfu": flops[0] / t / (peak * world),
           "mfu_verl": flops[1] / t / (peak * world), "hfu": flops[2] / t / (peak * world), "peak_mem_gb": peak_mem}
    del engine, actor, module
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


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
    p.add_argument("--model", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-1.5b"])
    p.add_argument("--rows", default=DEFAULT_ROWS)
    p.add_argument("--seqs", type=int, default=64, help="sequences per GPU per optimizer step")
    p.add_argument("--budget", type=int, default=16384, help="token budget of dynamic micro-batches")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (default: the default model's)")
    p.add_argument("--attn", default="rlforge_varlen",
                   help="attention implementation of the packed rows: rlforge_varlen, flex_attention, sdpa "
                        "('' = the model's default, sdpa)")
    p.add_argument("--head", default="chunked,plain",
                   help="log-prob implementations to time, comma-separated: chunked (LM head in chunks) and/or plain")
    p.add_argument("--chunk-size", type=int, default=FusedKernelOptions().chunk_size,
                   help="positions per chunk of the chunked head (fused_kernel_options.chunk_size)")
    p.add_argument("--profile", action="store_true",
                   help="profile one more step of every row: top-15 GPU kernels by total time and peak memory")
    args = p.parse_args()
    heads = [h for h in args.head.split(",") if h]
    if not heads or any(h not in ("chunked", "plain") for h in heads):
        p.error(f"--head {args.head!r}: expected a comma-separated subset of chunked,plain")
    dev_type = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: a smoke run of the script only
    info = init_distributed(dev_type) if "WORLD_SIZE" in os.environ else init_single_process(torch.device(dev_type))
    device = info.device
    rank, world = info.rank, info.world_size
    tok = load_tokenizer("preset:tiny", args.tokenizer)
    for model_name in args.model:
        base = load_causal_lm(f"preset:{model_name}", tok, seed=0)
        batch = make_batch(base.config.vocab_size, args.seqs, seed=rank, eos=tok.eos_token_id, pad=tok.pad_token_id)
        lens = batch["attention_mask"].sum(-1)
        if rank == 0:
            print(f"\n{model_name}: {world} GPU(s), {args.seqs} seqs/GPU, valid tokens/GPU {int(lens.sum())}, "
                  f"padded {batch['input_ids'].numel()}, max len {int(lens.max())}, budget {args.budget}", flush=True)
            print(f"{'row':<26} {'head':<8} {'step s':>8} {'tokens/s':>10} {'MFU':>7} {'MFU verl':>8} {'HFU':>7} "
                  f"{'peak GB':>8}", flush=True)
        for row in args.rows.split(","):
            for head in heads:
                try:
                    r = run_row(row, head, base, batch, args, device, world, rank)
                    line = (f"{row:<26} {head:<8} {r['time_s']:>8.3f} {r['tokens_per_s']:>10.0f} {r['mfu']:>7.1%} "
                            f"{r['mfu_verl']:>8.1%} {r['hfu']:>7.1%} {r['peak_mem_gb']:>8.1f}")
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
                    line = f"{row:<26} {head:<8} out of memory"
                if rank == 0:
                    print(line, flush=True)
        del base
    return 0


if __name__ == "__main__":
    sys.exit(main())

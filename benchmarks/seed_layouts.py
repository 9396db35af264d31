"""The seed configuration's three actor layouts, end to end through ``rlforge train`` (issue 8).

    # the real run: 8 GPUs, Qwen2.5-7B shape, GSM8K-shaped workload
    python benchmarks/seed_layouts.py --gpus 8 --model preset:qwen2.5-7b --tokenizer .tok --out OUT
    # the CPU substitute: 8 gloo processes, a tiny model whose heads and layers divide TP=4 and PP=4
    python benchmarks/seed_layouts.py --cpu --gpus 8 --out OUT

Layouts (``--layouts``):
  tp4pp2   ``actor.strategy=megatron``, TP=4, PP=2
  tp2pp4   ``actor.strategy=megatron``, TP=2, PP=4
  fsdp2    ``actor.strategy=fsdp2`` with ``fsdp_config.forward_prefetch=True``

Settings of the seed (each a verl key): ``actor.use_dynamic_bsz=True``,
``actor.ppo_max_token_len_per_gpu=4096``, ``model.enable_gradient_checkpointing=True``,
``model.enable_activation_offload=True``, ``rollout.gpu_memory_utilization=0.6``; workload
``--prompts`` (256) × ``--n`` (8), prompts of at most ``--prompt-len`` (512) tokens, responses of
at most ``--response-len`` (1024).  Each layout runs ``--steps`` steps in its own ``rlforge train``
process; the table reports the mean over the steps after the first: GPU utilization, idle ratio,
tokens/hour, actor MFU, time per step, the stage breakdown and peak memory.  Metrics that a run
did not log (no GPU) print as ``-``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

LAYOUTS = {
    "tp4pp2": ["actor_rollout_ref.actor.strategy=megatron",
               "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
               "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"],
    "tp2pp4": ["actor_rollout_ref.actor.strategy=megatron",
               "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
               "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=4"],
    "fsdp2": ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.forward_prefetch=True"],
}
STAGES = ("gen", "reward", "old_log_prob", "ref", "adv", "update_actor")
COLUMNS = ("perf/gpu_util/mean", "perf/idle_ratio", "perf/tokens_per_hour", "perf/mfu/actor", "timing_s/step",
           "perf/max_memory_allocated_gb")


def overrides(args: argparse.Namespace, layout: str, run_dir: Path) -> list[str]:
    common = [
        f"trainer.n_gpus_per_node={args.gpus}", f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable",
        "trainer.logger=[console,file]", f"trainer.default_local_dir={run_dir}", "trainer.profile=true",
        f"data.train_batch_size={args.prompts}", f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"data.max_prompt_length={args.prompt_len}", f"data.max_response_length={args.response_len}",
        "actor_rollout_ref.actor.use_dynamic_bsz=True", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096",
        "actor_rollout_ref.model.enable_gradient_checkpointing=True",
        "actor_rollout_ref.model.enable_activation_offload=True",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.model.path={args.model}",
    ]
    if args.cpu:
        common += [
            "trainer.device=cpu", "actor_rollout_ref.model.tokenizer_path=builtin:integers",
            "data.train_files=builtin:distribution", "data.val_files=null",
            "actor_rollout_ref.model.override_config={num_hidden_layers: 4, num_attention_heads: 4, num_key_value_heads: 4}",
        ]
    else:
        common += ["actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.ignore_eos=True"]
        if args.tokenizer:
            common.append(f"actor_rollout_ref.model.tokenizer_path={args.tokenizer}")
    return common + LAYOUTS[layout] + args.extra


def summarise(run_dir: Path) -> dict[str, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "timing_s/step" in r]
    measured = rows[1:] or rows
    keys = {k for r in measured for k in r}
    return {k: sum(r[k] for r in measured if k in r) / sum(1 for r in measured if k in r) for k in keys
            if all(isinstance(r.get(k, 0.0), (int, float)) for r in measured)}


def fmt(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=8, help="processes (GPUs, or gloo processes with --cpu)")
    ap.add_argument("--cpu", action="store_true", help="run on CPU (gloo) with a tiny model")
    ap.add_argument("--model", default=None, help="default: preset:qwen2.5-7b, or preset:tiny with --cpu")
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--layouts", default="tp4pp2,tp2pp4,fsdp2")
    ap.add_argument("--prompts", type=int, default=None, help="default 256 (GPU) / 8 (CPU)")
    ap.add_argument("--n", type=int, default=None, help="default 8 (GPU) / 4 (CPU)")
    ap.add_argument("--prompt-len", type=int, default=None, help="default 512 (GPU) / 16 (CPU)")
    ap.add_argument("--response-len", type=int, default=None, help="default 1024 (GPU) / 8 (CPU)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="seed_layouts_out")
    ap.add_argument("--extra", nargs="*", default=[], help="more overrides, key=value")
    args = ap.parse_args()
    cpu = args.cpu
    args.model = args.model or ("preset:tiny" if cpu else "preset:qwen2.5-7b")
    args.prompts = args.prompts or (8 if cpu else 256)
    args.n = args.n or (4 if cpu else 8)
    args.prompt_len = args.prompt_len or (16 if cpu else 512)
    args.response_len = args.response_len or (8 if cpu else 1024)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, float] | str] = {}
    for layout in args.layouts.split(","):
        run_dir = out / layout
        cmd = [sys.executable, "-m", "rlforge.cli", "train", *overrides(args, layout, run_dir)]
        print("$ rlforge train " + " ".join(cmd[4:]), flush=True)
        t = time.perf_counter()
        with open(out / f"{layout}.log", "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
        wall = time.perf_counter() - t
        results[layout] = summarise(run_dir) if rc == 0 else f"failed (exit {rc}, see {out / layout}.log)"
        print(f"{layout}: exit {rc} in {wall:.0f} s", flush=True)

    head = "| layout | GPU util | idle ratio | tokens/hour | MFU actor | s/step | " + " | ".join(
        f"{s} s" for s in STAGES) + " | peak alloc GB | mesh tp/pp/dp | pp bubble |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for layout, m in results.items():
        if isinstance(m, str):
            lines.append(f"| {layout} | {m} |")
            continue
        g = m.get
        lines.append(
            f"| {layout} | {fmt(g('perf/gpu_util/mean'), '.1f')} | {fmt(g('perf/idle_ratio'), '.3f')} | "
            f"{fmt(g('perf/tokens_per_hour'), ',.0f')} | {fmt(g('perf/mfu/actor'), '.3f')} | "
            f"{fmt(g('timing_s/step'), '.2f')} | " + " | ".join(fmt(g(f"timing_s/{s}"), ".2f") for s in STAGES)
            + f" | {fmt(g('perf/max_memory_allocated_gb'), '.1f')} | "
            f"{fmt(g('parallel/tp'), '.0f')}/{fmt(g('parallel/pp'), '.0f')}/{fmt(g('parallel/dp'), '.0f')} | "
            f"{fmt(g('parallel/pp_bubble'), '.2f')} |")
    table = "\n".join(lines)
    print("\n" + table)
    (out / "seed_layouts.md").write_text(table + "\n")
    (out / "seed_layouts.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

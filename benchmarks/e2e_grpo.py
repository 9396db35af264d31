"""End-to-end GRPO steps on one GPU: rlforge's trainer against TRL's ``GRPOTrainer``, same workload.

Run on the GPU machine (no internet needed).  The baseline needs ``trl==1.16.0`` and
``datasets``; where they are not installed, carry their wheels and those of ``dill`` and
``multiprocess`` (``pip download --no-deps`` for the machine's Python) and put them on ``PYTHONPATH``.
``--skip-trl`` runs rlforge alone, ``--skip-rlforge`` TRL alone.

    python benchmarks/e2e_grpo.py --tokenizer .tok --out e2e_out
    python benchmarks/e2e_grpo.py --tokenizer .tok --gpus 0,1   # the four runs, two at a time, one per GPU
    python benchmarks/e2e_grpo.py --tokenizer .tok --models qwen2.5-0.5b --skip-trl --rlforge-rollout native

Issue 39 (``auto``): the row "as a user runs it" beside the hand-tuned one and the benchmark's own, one run:

    python benchmarks/e2e_grpo.py --tokenizer .tok --skip-trl --reps 1 --steps 3 \
        --rlforge-setups rlforge,rlforge-hand,rlforge-auto --out e2e_auto
    python benchmarks/e2e_grpo.py --tokenizer .tok --skip-trl --reps 1 --steps 3 --models qwen2.5-7b \
        --prompts 32 --response-len 512 --rlforge-setups rlforge,rlforge-auto --rlforge-extra \
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=true --out e2e_auto_7b

(the 7B ``rlforge`` row with ``--rlforge-extra ...optimizer_offload=true`` is the hand setting; ``rlforge-auto``
ignores the extras).  Each run's log (``OUT/<setup>_<model>.log``) holds the tuner's table after the start
line; ``rlforge tune --check-memory OUT/rep1/rlforge-auto_<model>`` compares its memory model with the run.

Workload (the same for both frameworks; flags change it):
- models: ``preset:qwen2.5-0.5b`` and ``preset:qwen2.5-1.5b``, random ("dummy") weights built
  from the preset config (fp32 master weights, bf16 autocast), the tokenizer of ``--tokenizer``;
- 64 prompts x n=8 responses per step, every prompt exactly 256 tokens after the chat template
  (random single-token words, built once and written to ``OUT/prompts.jsonl``), responses of
  at most 1024 tokens, sampled at temperature 1 with no top-p/top-k;
- GRPO: group-normalised advantages (TRL ``scale_rewards="group"``), one optimizer step per
  RL step (rlforge ``ppo_mini_batch_size=64``; TRL ``per_device_train_batch_size x
  gradient_accumulation_steps = 512``), token-mean loss aggregation (TRL ``loss_type="dapo"``),
  clip 0.2, lr 1e-6 constant, grad-norm clip 1.0, gradient checkpointing on, KL coefficient
  ``--beta`` (default 0: no reference model in either); TRL runs padded micro-batches of ``--micro-batch``
  sequences, rlforge its own token-budget micro-batches (``use_dynamic_bsz``, ``--token-budget`` tokens) with
  the padding-free forward (``use_remove_padding``) and the chunked LM head (``use_fused_kernels``), as each
  framework is meant to be run;
- a dummy reward: a uniform random number per response.

Response lengths (``--lengths``): ``fixed`` (the default, as before) lets only a sampled EOS end a response (below);
``lognormal`` is the long-tail workload: each response's length is drawn from the log-normal of math-reasoning RL
(``benchmarks/longtail.py``: mean 0.37 x and 5 % of the responses at ``--response-len``, after DeepScaleR's
8K stage; seeded per prompt x sample, so every setup gets the same lengths) and imposed by the benchmark
alone through the native engine's test hook ``RLFORGE_TEST_RESPONSE_LENGTHS`` (an EOS forced at the drawn
length, :mod:`rlforge.rollout.native.forced_eos`) for rlforge, and through a logits processor on ``generate``
for TRL (``longtail.ForcedLengths``: the same length for the same prompt ids and sample index; checked
against the native engine in ``tests/benchmarks/test_longtail.py``).  It needs ``--rlforge-rollout native``,
and TRL variants on plain ``generate`` (not ``trl-cb``).

EOS: nothing stops a response at EOS except sampling it.  A random-weight model samples each
of the tokenizer's EOS ids with probability about 1/vocab per token, so about 1-2 % of the
responses end before 1024 tokens, in both frameworks alike; and both generate a batch until its
longest response ends, so the generation work is the same.  The mean response length of each run
is in the JSON.

Measured per run, over ``--steps`` steps after ``--warmup`` steps (fewer, marked "(cut)" in the steps column,
when ``--run-time-limit`` stopped the run first):
- tokens/s: prompt + response tokens of the step (valid tokens, no padding) / step wall time, on
  one GPU (rlforge ``perf/throughput``; TRL: the increase of ``state.num_input_tokens_seen``,
  which TRL counts the same way, over the time from ``on_step_begin`` to ``on_step_end``);
- s/step; gen s: time in generation (rlforge ``timing_s/gen``; TRL ``_generate_single_turn``,
  timed by a subclass); train s: s/step - gen s (everything else: reward, log-probs, update);
- GPU util %: NVML utilisation averaged over the step; idle ratio: fraction of the step's
  100 ms samples with utilisation < 5 %; both from rlforge's sampler (``rlforge.perf.gpu_sampler``)
  for both frameworks.  The sampler's own CPU time per wall second is checked against 1 %.
- MFU ours / MFU verl / HFU: the FLOPs of the step's training pass (forward + backward of the one
  update; with ``--beta`` > 0 also the reference's forward) per second of step wall time (s/step:
  generation included, so these are end-to-end utilisations), over the GPU's bf16 peak, in the three
  conventions of ``rlforge.perf.flops``: ours, verl's ``FlopsCounter`` (also counts the embedding),
  and hardware FLOPs (both frameworks checkpoint the decoder layers, so they run 4 forwards, not 3;
  rlforge's chunked LM head also recomputes its forward in backward, TRL's head does not; both
  compute logits at the response positions only).  Per step: prompts x n sequences of the measured
  mean length (tokens per step / sequences; the attention term is then exact for equal lengths,
  which ~98 % of the responses are here, and a lower bound otherwise).  An extra
  ``old_log_prob`` forward (``--rlforge-extra actor_rollout_ref.actor.recompute_old_log_prob=true``)
  is not counted.

Method (issue 17): both frameworks load one saved random checkpoint per model
(``OUT/weights/<model>``, seed 0, float32; ``--no-same-weights`` lets each build its own);
every (model, framework) run is repeated ``--reps`` times (default 3), the repetitions
interleaved (rep 1 of every run, then rep 2, ...); the main table shows each one's median
repetition by s/step and a second table min/median/max of tokens/s, s/step, gen s, train s, the
mean response length and the generated tokens/s (response tokens per second of generation).
TRL runs each setup of ``--trl-variants`` (:data:`TRL_VARIANTS`; default ``trl-fast``, the fastest TRL setup
measured (plain ``generate``, no checkpointing, liger), and transformers' continuous batching) as its own row;
"vs TRL" divides by the fastest of them.

Each framework and model runs in its own subprocess (a fresh CUDA context): rlforge as
``python -m rlforge.cli train ... trainer.logger=[file]``, reading ``metrics.jsonl``; TRL as this
script with ``--trl-worker``.  Output: one markdown table (stdout and ``OUT/e2e_grpo.md``) and
``OUT/e2e_grpo.json``; logs in ``OUT/<framework>_<model>.log``.

One generation feeds exactly one optimizer step here (``ppo_mini_batch_size = train_batch_size``),
so neither framework runs a separate old-log-prob forward: TRL uses the detached current
log-probs (ratio 1), and so does rlforge by default since 2026-12-01
(``actor.recompute_old_log_prob=null``; before, it recomputed them in an ``old_log_prob`` stage as
verl does; ``--rlforge-extra actor_rollout_ref.actor.recompute_old_log_prob=true`` brings that back).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODELS = ("qwen2.5-0.5b", "qwen2.5-1.5b")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_DISABLED": "true"}
DUMMY_REWARD = '''"""Dummy reward of the e2e benchmark: a uniform random score per response."""
import random


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return random.random()
'''


TRL_VARIANTS: dict[str, dict[str, Any]] = {
    "trl": {},
    "trl-cb": {"use_transformers_continuous_batching": True},
    "trl-nockpt": {"gradient_checkpointing": False},
    "trl-liger": {"use_liger_kernel": True},
    "trl-fast": {"gradient_checkpointing": False, "use_liger_kernel": True},
}
"""TRL setups (``--trl-variants``), as ``GRPOConfig`` fields over the common ones of :func:`trl_worker`:
``trl`` plain ``generate`` with gradient checkpointing (the script's setup since it was written);
``trl-cb`` transformers' continuous batching for generation (TRL's non-vLLM fast path,
``use_transformers_continuous_batching=True``); ``trl-nockpt`` without gradient checkpointing;
``trl-liger`` with transformers' ``use_liger_kernel`` (needs liger-kernel; TRL then computes the GRPO
loss with liger's chunked fused-linear GRPO loss); ``trl-fast`` both of the last two."""


@dataclass(frozen=True)
class Workload:
    prompts: int = 64
    n: int = 8
    prompt_len: int = 256
    response_len: int = 1024
    micro_batch: int = 16
    token_budget: int = 16384
    beta: float = 0.0
    lr: float = 1e-6
    steps: int = 5
    warmup: int = 1
    profile: bool = False
    """One more step after the measured ones, under ``torch.profiler`` (never measured)."""
    lengths: str = "fixed"
    """``fixed`` (EOS only where sampled) or ``lognormal`` (the long-tail workload, :func:`length_env`)."""

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps + int(self.profile)

    @property
    def profile_step(self) -> int | None:
        """1-based index of the profiled step, or None."""
        return self.total_steps if self.profile else None


# ---------------------------------------------------------------------------- prompts
def single_token_words(tok: Any, limit: int = 30000) -> list[str]:
    """Words ``" abc"`` (3-8 lowercase letters) that the tokenizer encodes as one token."""
    words = []
    for i in range(min(limit, len(tok))):
        s = tok.decode([i])
        if re.fullmatch(r" [a-z]{3,8}", s) and tok.encode(s, add_special_tokens=False) == [i]:
            words.append(s)
    if len(words) < 50:
        raise SystemExit(f"the tokenizer has only {len(words)} single-token words; give another --tokenizer")
    return words


def exact_length_prompt(tok: Any, words: list[str], length: int, rng: random.Random) -> list[dict[str, str]]:
    """Chat messages whose chat-templated tokens (rlforge's and TRL's tokenization) number ``length``."""
    from rlforge.data.dataset import tokenize_messages

    k = length
    for _ in range(20):
        content = "".join(rng.choice(words) for _ in range(max(k, 1))).lstrip()
        messages = [{"role": "user", "content": content}]
        got = len(tokenize_messages(tok, messages))
        if got == length:
            return messages
        k += length - got
    raise SystemExit(f"could not build a prompt of exactly {length} tokens with this tokenizer")


def write_inputs(out: Path, tok: Any, wl: Workload, seed: int = 0) -> tuple[Path, Path]:
    """``OUT/prompts.jsonl`` (verl-format rows, one prompt per row, enough for every step) and
    ``OUT/dummy_reward.py``."""
    rng = random.Random(seed)
    words = single_token_words(tok)
    data = out / "prompts.jsonl"
    with data.open("w") as fh:
        for i in range(wl.prompts * wl.total_steps):
            row = {"data_source": "e2e/dummy", "prompt": exact_length_prompt(tok, words, wl.prompt_len, rng),
                   "reward_model": {"ground_truth": "0"}, "extra_info": {"index": i}}
            fh.write(json.dumps(row) + "\n")
    reward = out / "dummy_reward.py"
    reward.write_text(DUMMY_REWARD)
    return data, reward


# ---------------------------------------------------------------------------- rlforge
def rlforge_overrides(model: str, wl: Workload, data: Path, reward: Path, run_dir: Path, tokenizer: str | None,
                      rollout: str, weights: Path | None = None) -> list[str]:
    """rlforge's command-line overrides for one run; ``weights``: an HF folder both frameworks load
    (None: the preset's random weights, ``preset:<model>``)."""
    arr = "actor_rollout_ref"
    o = [
        f"{arr}.model.path={weights if weights else 'preset:' + model}",
        f"{arr}.model.enable_gradient_checkpointing=true",
        f"{arr}.actor.strategy=fsdp2",  # verl's tuning guides' engine; one device runs it on a 1-rank mesh
        "trainer.n_gpus_per_node=1",  # one process (verl's defaults would take every visible GPU); extras may change it
        f"data.train_files={data}", "data.val_files=null", f"data.train_batch_size={wl.prompts}",
        f"data.max_prompt_length={wl.prompt_len}", f"data.max_response_length={wl.response_len}",
        "data.shuffle=false", "algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=true",
        f"{arr}.rollout.name={rollout}", f"{arr}.rollout.n={wl.n}", f"{arr}.rollout.temperature=1.0",
        f"{arr}.rollout.top_p=1.0", f"{arr}.rollout.top_k=-1", f"{arr}.rollout.tensor_model_parallel_size=1",
        f"{arr}.rollout.log_prob_micro_batch_size_per_gpu={wl.micro_batch}",
        f"{arr}.ref.log_prob_micro_batch_size_per_gpu={wl.micro_batch}",
        f"{arr}.actor.ppo_mini_batch_size={wl.prompts}", f"{arr}.actor.ppo_micro_batch_size_per_gpu={wl.micro_batch}",
        f"{arr}.actor.ppo_epochs=1", f"{arr}.actor.loss_agg_mode=token-mean", f"{arr}.actor.clip_ratio=0.2",
        # rlforge's own batching (what its docs recommend): token-budget micro-batches, padding-free forward
        f"{arr}.actor.use_dynamic_bsz=true", f"{arr}.actor.ppo_max_token_len_per_gpu={wl.token_budget}",
        f"{arr}.rollout.log_prob_max_token_len_per_gpu={wl.token_budget}", f"{arr}.model.use_remove_padding=true",
        f"{arr}.model.use_fused_kernels=true",  # the chunked LM head: no (tokens, vocab) float32 logits
        f"{arr}.actor.grad_clip=1.0", f"{arr}.actor.entropy_coeff=0", f"{arr}.actor.optim.lr={wl.lr}",
        f"{arr}.actor.optim.lr_scheduler_type=constant", f"{arr}.actor.optim.weight_decay=0.0",
        f"{arr}.actor.use_kl_loss={'true' if wl.beta > 0 else 'false'}", f"{arr}.actor.kl_loss_coef={wl.beta}",
        f"{arr}.actor.kl_loss_type=low_var_kl",
        f"custom_reward_function.path={reward}", "custom_reward_function.name=compute_score",
        f"trainer.total_training_steps={wl.total_steps}", "trainer.logger=[file]", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.resume_mode=disable", "trainer.profile=true",
        "trainer.n_gpus_per_node=1", f"trainer.default_local_dir={run_dir}",
    ]
    if tokenizer:
        o.append(f"{arr}.model.tokenizer_path={tokenizer}")
    if wl.profile_step is not None:
        o.append(f"trainer.profile_steps=[{wl.profile_step}]")
    return o


HAND_TUNED = ("actor_rollout_ref.model.use_liger=true", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
              "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false",
              "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=32768",
              "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=32768")
"""Issue 39's hand-tuned setting (H200, 2026-12-03): liger, no checkpointing, no reshard, a 32k budget."""

PARTIAL_ROLLOUT = ("async_training.partial_rollout=true", "async_training.staleness_threshold=0.25",
                   "async_training.max_version_gap=2", "actor_rollout_ref.rollout.calculate_log_probs=true")
"""Issue 41's partial rollout: a quarter more prompt groups queued, stop at the batch's groups, carry the tail."""

RLFORGE_SETUPS = ("rlforge", "rlforge-auto", "rlforge-hand", "rlforge-partial", "rlforge-auto-partial")
"""rlforge rows (``--rlforge-setups``): ``rlforge`` the overrides of :func:`rlforge_overrides` (the
benchmark's own levers) plus ``--rlforge-extra``; ``rlforge-auto`` as a user runs it: the workload's keys
only, every lever key left to the tuner (``auto``), no extras; ``rlforge-hand`` the ``rlforge`` row with
:data:`HAND_TUNED` after it; ``rlforge-partial`` the ``rlforge`` row with :data:`PARTIAL_ROLLOUT` after it;
``rlforge-auto-partial`` the ``rlforge-auto`` row with :data:`PARTIAL_ROLLOUT` after it."""


def setup_overrides(setup: str, base: list[str], extra: list[str]) -> list[str]:
    """The overrides of rlforge row ``setup`` (:data:`RLFORGE_SETUPS`) from the benchmark's ``base``."""
    if setup in ("rlforge-auto", "rlforge-auto-partial"):
        from rlforge.config.auto_keys import LEVER_KEYS

        return [*(o for o in base if o.partition("=")[0] not in LEVER_KEYS),
                *(PARTIAL_ROLLOUT if setup == "rlforge-auto-partial" else ())]
    return [*base, *extra, *(HAND_TUNED if setup == "rlforge-hand" else ()),
            *(PARTIAL_ROLLOUT if setup == "rlforge-partial" else ())]


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize_rlforge(rows: list[dict[str, Any]], wl: Workload) -> dict[str, Any]:
    """Per-run numbers from rlforge's ``metrics.jsonl`` rows (the steps after the warm-up)."""
    measured = [r for r in rows if "timing_s/step" in r and wl.warmup < r["step"] <= wl.warmup + wl.steps]
    if not measured:
        raise RuntimeError("no measured steps in metrics.jsonl")
    step_s = sum(r["timing_s/step"] for r in measured)
    tokens = sum(r["perf/total_num_tokens"] for r in measured)
    gen_s = sum(r.get("timing_s/gen", 0.0) for r in measured)
    from rlforge.perf.run_data import STEP_STAGES

    found = {k.removeprefix("timing_s/") for r in measured for k in r if k.startswith("timing_s/")} - {"step"}
    stages = sorted(found, key=lambda s: STEP_STAGES.index(s) if s in STEP_STAGES else len(STEP_STAGES))
    return {
        "steps": len(measured), "tokens_per_s": tokens / step_s, "s_per_step": step_s / len(measured),
        "gen_s": gen_s / len(measured), "train_s": (step_s - gen_s) / len(measured),
        "gpu_util": _mean([r["perf/gpu_util/mean"] for r in measured if "perf/gpu_util/mean" in r]),
        "idle_ratio": _mean([r["perf/idle_ratio"] for r in measured if "perf/idle_ratio" in r]),
        "sampler_overhead": _mean([r["perf/gpu_sampler_overhead"] for r in measured
                                   if "perf/gpu_sampler_overhead" in r]),
        "tokens_per_step": tokens / len(measured),
        "response_length_mean": _mean([r["response_length/mean"] for r in measured]),
        "stages_s": {s: sum(r.get(f"timing_s/{s}", 0.0) for r in measured) / len(measured) for s in stages},
        "stages_gpu_util": {s: _mean([r[f"perf/gpu_util/{s}"] for r in measured if f"perf/gpu_util/{s}" in r])
                            for s in stages},
        "mfu_actor": _mean([r["perf/mfu/actor"] for r in measured if "perf/mfu/actor" in r]),
        # actor.use_prefix_grouper: decoder-layer tokens and attention s^2 the update did not compute, per step
        "saved_tokens": _mean([r.get("perf/prefix_grouper/saved_tokens", 0.0) for r in measured]) or 0.0,
        "saved_s2": _mean([r.get("perf/prefix_grouper/saved_s2", 0.0) for r in measured]) or 0.0,
    }


def _extra_flag(extras: list[str], keys: tuple[str, ...], default: bool) -> bool:
    """The boolean an ``--rlforge-extra`` override gives one of ``keys`` (the last one wins), else ``default``."""
    value = default
    for item in extras:
        key, _, v = item.lstrip("+").partition("=")
        if key.strip() in keys:
            value = v.strip().lower() in ("true", "1", "yes")
    return value


def gpu_peak_flops(gpu: str | None) -> float | None:
    """bf16 dense peak of the GPU a run uses, from its NVML name (``rlforge.perf.flops.PEAK_BF16_FLOPS``),
    read without a CUDA context in this process; None without NVML or for a GPU not in the table.
    ``gpu``: the run's ``CUDA_VISIBLE_DEVICES`` entry; None = the first visible GPU."""
    from rlforge.perf.flops import peak_flops_for_name

    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    index = gpu if gpu is not None else (visible[0] if visible else "0")
    try:
        import pynvml

        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(int(index)))
    except Exception:  # no NVML, no driver, a UUID entry: no peak, the MFU columns show "-"
        return None
    return peak_flops_for_name(name.decode() if isinstance(name, bytes) else str(name))


def mfu_three_ways(run: dict[str, Any], framework: str, config: Any, wl: Workload, peak: float | None,
                   rlforge_extra: list[str]) -> dict[str, float | None]:
    """``mfu_ours``, ``mfu_verl``, ``hfu`` of a finished run (fractions; see the module docstring)."""
    from rlforge.perf.flops import CONVENTIONS, forward_flops, shared_prompt_flops, train_flops

    out: dict[str, float | None] = {"mfu_ours": None, "mfu_verl": None, "hfu": None}
    seqs = wl.prompts * wl.n
    tokens, step_s = run.get("tokens_per_step"), run.get("s_per_step")
    if peak is None or not tokens or not step_s:
        return out
    seqlens = [tokens / seqs] * seqs
    response = max(tokens - seqs * wl.prompt_len, 0.0)
    arr = "actor_rollout_ref"
    if framework.startswith("rlforge"):  # rlforge-auto: the tuner's choice is in its log, not counted here
        rlforge_extra = [*rlforge_extra, *(HAND_TUNED if framework == "rlforge-hand" else ())]
        recompute = _extra_flag(rlforge_extra, (f"{arr}.model.enable_gradient_checkpointing",), True)
        chunked = _extra_flag(rlforge_extra, (f"{arr}.model.use_fused_kernels", f"{arr}.actor.use_fused_kernels"),
                              True)
        head_tokens, head_recompute = (response, True) if chunked else (tokens, False)
    else:  # TRL: logits_to_keep = the completion positions; HF's head is not recomputed
        recompute = bool(TRL_VARIANTS.get(framework, {}).get("gradient_checkpointing", True))
        head_tokens, head_recompute = response, False
    for name, convention in zip(out, CONVENTIONS, strict=True):
        flops = train_flops(config, seqlens, convention, recompute, head_tokens=head_tokens,
                            head_recompute=head_recompute)
        if wl.beta > 0:  # the reference's forward, the head on the response positions in both
            flops += forward_flops(config, seqlens, convention, head_tokens=response)
        if convention == "hfu":  # hardware FLOPs: not the prompt copies that actor.use_prefix_grouper skipped
            flops -= shared_prompt_flops(config, run.get("saved_tokens") or 0.0, run.get("saved_s2") or 0.0, recompute)
        out[name] = flops / step_s / peak
    return out


def length_env(wl: Workload) -> dict[str, str]:
    """The environment that imposes ``wl.lengths`` on an rlforge run: for ``lognormal`` the native engine's
    test hook pointed at ``benchmarks/longtail.py:response_length`` (lengths up to ``wl.response_len``, seed 0)."""
    if wl.lengths != "lognormal":
        return {}
    hook = Path(__file__).resolve().parent / "longtail.py"
    return {"RLFORGE_TEST_RESPONSE_LENGTHS": f"{hook}:response_length", "LONGTAIL_MAX_LEN": str(wl.response_len),
            "LONGTAIL_SEED": "0"}


def run_rlforge(model: str, wl: Workload, args: argparse.Namespace, out: Path, data: Path, reward: Path,
                gpu: str | None = None, weights: Path | None = None, setup: str = "rlforge") -> dict:
    run_dir = out / f"{setup}_{model}"
    base = rlforge_overrides(model, wl, data, reward, run_dir, args.tokenizer, args.rlforge_rollout, weights)
    cmd = [sys.executable, "-m", "rlforge.cli", "train", "--job", "none",
           *setup_overrides(setup, base, args.rlforge_extra)]
    finished = _run(cmd, out / f"{setup}_{model}.log", args.run_time_limit, gpu, length_env(wl))
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.exists() else []
    summary = summarize_rlforge(rows, wl)
    trace = run_dir / "trace" / f"torch_rank0_step{wl.profile_step}.json"
    return {**summary, "finished": finished or summary["steps"] >= wl.steps,
            **({"profile_trace": str(trace)} if wl.profile_step and trace.exists() else {})}


# ---------------------------------------------------------------------------- TRL
def run_trl(model: str, wl: Workload, args: argparse.Namespace, out: Path, data: Path, gpu: str | None = None,
            variant: str = "trl", weights: Path | None = None) -> dict:
    result = out / f"{variant}_{model}.json"
    cmd = [sys.executable, os.path.abspath(__file__), "--trl-worker", model, "--workload", json.dumps(asdict(wl)),
           "--data", str(data), "--out", str(out), "--trl-variant", variant] + (
        ["--tokenizer", args.tokenizer] if args.tokenizer else []) + (["--weights", str(weights)] if weights else [])
    result.unlink(missing_ok=True)
    finished = _run(cmd, out / f"{variant}_{model}.log", args.run_time_limit, gpu)
    if not result.exists():
        raise RuntimeError(f"no measured step finished (see {out / f'{variant}_{model}.log'})")
    summary = json.loads(result.read_text())
    return {**summary, "finished": finished or summary["steps"] >= wl.steps}


def trl_worker(model_name: str, wl: Workload, data: Path, out: Path, tokenizer: str | None, variant: str = "trl",
               weights: Path | None = None) -> int:
    """Train ``wl.total_steps`` GRPO steps with TRL's ``variant`` (:data:`TRL_VARIANTS`) and write
    ``OUT/<variant>_<model>.json``; ``weights``: the HF folder rlforge loads too (None: the preset's
    random weights from seed 0)."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlforge.models import load_causal_lm, load_tokenizer
    from rlforge.perf.gpu_sampler import GpuSampler, gpu_step_metrics, nvml_reader
    from rlforge.perf.timer import timed
    from rlforge.perf.trace import Timeline

    tok = load_tokenizer(f"preset:{model_name}", tokenizer)
    model = load_causal_lm(str(weights) if weights else f"preset:{model_name}", tok, seed=0)  # fp32, as rlforge
    if wl.lengths == "lognormal":  # the lengths rlforge's rows get (length_env), on TRL's generate
        from longtail import generate_with_lengths

        generate_with_lengths(model, tok.eos_token_id, tok.pad_token_id, wl.response_len, seed=0)
    if wl.beta > 0:  # TRL builds its reference model from config._name_or_path
        ref_dir = out / f"trl_ref_{model_name}"
        model.save_pretrained(ref_dir)
        model.config._name_or_path = str(ref_dir)
    prompts = [json.loads(line)["prompt"] for line in data.read_text().splitlines() if line.strip()]
    dataset = Dataset.from_list([{"prompt": p} for p in prompts])
    timeline = Timeline()
    scratch: dict[str, float] = {}

    class TimedGRPOTrainer(GRPOTrainer):
        """Times TRL's generation (``_generate_single_turn``) and its generate-and-score stage."""

        def _generate_single_turn(self, *a: Any, **kw: Any) -> Any:
            with timed("gen", scratch, timeline):
                return super()._generate_single_turn(*a, **kw)

        def _generate_and_score_completions(self, *a: Any, **kw: Any) -> Any:
            with timed("generate_and_score", scratch, timeline):
                return super()._generate_and_score_completions(*a, **kw)

    steps: list[tuple[float, float, float]] = []  # (start_s, end_s, tokens)

    trace_path = out / f"{variant}_{model_name}_trace_step{wl.profile_step}.json"

    class StepTimer(TrainerCallback):
        prof: Any = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if state.global_step + 1 == wl.profile_step:  # the extra, unmeasured step
                acts = [torch.profiler.ProfilerActivity.CPU] + (
                    [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
                self.prof = torch.profiler.profile(activities=acts)
                self.prof.__enter__()
            self.t0, self.tok0 = time.perf_counter(), state.num_input_tokens_seen

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if self.prof is not None:
                self.prof.__exit__(None, None, None)
                self.prof.export_chrome_trace(str(trace_path))
                self.prof = None
                return
            steps.append((self.t0, time.perf_counter(), float(state.num_input_tokens_seen - self.tok0)))
            if len(steps) > wl.warmup:  # a run stopped by the time limit keeps its measured steps
                write_result(state.log_history)

    def dummy_reward(completions: list[Any], **kw: Any) -> list[float]:
        return [random.random() for _ in completions]

    total = wl.prompts * wl.n
    common: dict[str, Any] = dict(
        output_dir=str(out / f"{variant}_{model_name}"), per_device_train_batch_size=wl.micro_batch,
        gradient_accumulation_steps=total // wl.micro_batch, num_generations=wl.n,
        max_completion_length=wl.response_len, temperature=1.0, top_p=1.0, top_k=0, beta=wl.beta,
        loss_type="dapo", scale_rewards="group", epsilon=0.2, num_iterations=1, learning_rate=wl.lr,
        lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, gradient_checkpointing=True,
        bf16=torch.cuda.is_available(), use_vllm=False, max_steps=wl.total_steps, logging_steps=1,
        save_strategy="no", report_to="none", shuffle_dataset=False, seed=0, dataloader_num_workers=0,
        disable_tqdm=True, log_completions=False,
    )
    cfg = GRPOConfig(**{**common, **TRL_VARIANTS[variant]})
    read = nvml_reader([torch.cuda.current_device()]) if torch.cuda.is_available() else None
    sampler = GpuSampler(read) if read is not None else None
    wall0 = time.perf_counter()

    def write_result(log_history: list[dict[str, Any]]) -> None:
        """``OUT/trl_<model>.json`` from the measured steps so far."""
        wall = time.perf_counter() - wall0
        measured = steps[wl.warmup:]
        lengths = [h["completions/mean_length"] for h in log_history
                   if "completions/mean_length" in h and wl.warmup < h.get("step", 0) <= wl.warmup + wl.steps]
        per_step = []
        for t0, t1, tokens in measured:
            gen = [(e.start_s, e.end_s) for e in timeline.events if e.name == "gen" and t0 <= e.start_s <= t1]
            gas = [(e.start_s, e.end_s) for e in timeline.events
                   if e.name == "generate_and_score" and t0 <= e.start_s <= t1]
            gpu = gpu_step_metrics(sampler.samples(t0, t1), (t0, t1), {"gen": gen}) if sampler else {}
            per_step.append({"s": t1 - t0, "tokens": tokens, "gen_s": sum(b - a for a, b in gen),
                             "gas_s": sum(b - a for a, b in gas), **gpu})
        n = len(per_step)
        step_s = sum(p["s"] for p in per_step)
        gen_s = sum(p["gen_s"] for p in per_step)
        gas_s = sum(p["gas_s"] for p in per_step)
        result = {
            **({"profile_trace": str(trace_path)} if trace_path.exists() else {}),
            "steps": n, "tokens_per_s": sum(p["tokens"] for p in per_step) / step_s, "s_per_step": step_s / n,
            "s_per_step_wall": (measured[-1][1] - steps[wl.warmup - 1][1]) / n if wl.warmup > 0 else None,
            "gen_s": gen_s / n, "train_s": (step_s - gen_s) / n,
            "gpu_util": _mean([p["perf/gpu_util/mean"] for p in per_step if "perf/gpu_util/mean" in p]),
            "idle_ratio": _mean([p["perf/idle_ratio"] for p in per_step if "perf/idle_ratio" in p]),
            "sampler_overhead": sampler.cpu_time_s() / wall if sampler else None,
            "tokens_per_step": sum(p["tokens"] for p in per_step) / n,
            "response_length_mean": _mean(lengths),
            "stages_s": {"gen": gen_s / n, "score_and_logp": (gas_s - gen_s) / n, "train": (step_s - gas_s) / n},
            "stages_gpu_util": {"gen": _mean([p["perf/gpu_util/gen"] for p in per_step if "perf/gpu_util/gen" in p])},
        }
        (out / f"{variant}_{model_name}.json").write_text(json.dumps(result, indent=1))

    trainer = TimedGRPOTrainer(model=model, reward_funcs=dummy_reward, args=cfg, train_dataset=dataset,
                               processing_class=tok, callbacks=[StepTimer()])
    wall0 = time.perf_counter()  # write_result reads it when called
    if sampler:
        sampler.start()
    trainer.train()
    if sampler:
        sampler.stop()
    write_result(trainer.state.log_history)
    return 0


# ---------------------------------------------------------------------------- output
def _run(cmd: list[str], log: Path, time_limit: float | None = None, gpu: str | None = None,
         extra_env: dict[str, str] | None = None) -> bool:
    """Run ``cmd`` with its output in ``log``; True when it finished, False when ``time_limit``
    seconds ran out first (the run is then stopped and summarised from the steps it completed).

    ``gpu``: the child's ``CUDA_VISIBLE_DEVICES`` (None: inherited).  Raises RuntimeError when it
    exits with an error."""
    env = {**(ENV if gpu is None else {**ENV, "CUDA_VISIBLE_DEVICES": gpu}), **(extra_env or {})}
    print(f"$ {'' if gpu is None else f'CUDA_VISIBLE_DEVICES={gpu} '}{' '.join(cmd[:6])} ... (log: {log})", flush=True)
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
        try:
            rc = proc.wait(timeout=time_limit)
        except subprocess.TimeoutExpired:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            print(f"  stopped after {time_limit:.0f} s (--run-time-limit); summarising the completed steps", flush=True)
            return False
    if rc != 0:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
        cause = next((ln for ln in reversed(lines) if "error" in ln.lower()), lines[-1] if lines else "no output")
        tail = "\n".join(lines[-15:])
        raise RuntimeError(f"exit status {rc}: {cause.strip()}\nlast lines of {log}:\n{tail}")
    return True


def _f(v: float | None, spec: str) -> str:
    return "-" if v is None else format(v, spec)


COLUMNS = ("model", "framework", "steps", "tokens/s", "s/step", "gen s", "train s", "GPU util %", "idle ratio",
           "MFU ours", "MFU verl", "HFU", "vs TRL")


def markdown_table(runs: list[dict[str, Any]]) -> str:
    """The stable result table: one row per (model, framework), rlforge before TRL; "vs TRL" is
    tokens/s over the fastest TRL variant's of the same model."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    trl: dict[str, dict[str, Any]] = {}  # per model, the fastest TRL variant's row
    for r in runs:
        if r["framework"].startswith("trl") and "error" not in r:
            if r["model"] not in trl or r["tokens_per_s"] > trl[r["model"]]["tokens_per_s"]:
                trl[r["model"]] = r
    for r in runs:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['framework']} | failed: {r['error'].splitlines()[0][:120]} |"
                         + " |" * (len(COLUMNS) - 3))
            continue
        base = trl.get(r["model"])
        ratio = r["tokens_per_s"] / base["tokens_per_s"] if base else None
        lines.append(" | ".join([
            f"| {r['model']}", r["framework"], f"{r['steps']}{'' if r.get('finished', True) else ' (cut)'}",
            _f(r["tokens_per_s"], ".0f"), _f(r["s_per_step"], ".2f"),
            _f(r["gen_s"], ".2f"), _f(r["train_s"], ".2f"), _f(r["gpu_util"], ".1f"), _f(r["idle_ratio"], ".3f"),
            _f(r.get("mfu_ours"), ".1%"), _f(r.get("mfu_verl"), ".1%"), _f(r.get("hfu"), ".1%"),
            _f(ratio, ".2f") + " |",
        ]))
    return "\n".join(lines)


def profile_sections(runs: list[dict[str, Any]]) -> str:
    """``--profile``: each run's profiled step summarised by :mod:`rlforge.perf.torch_trace`
    (GPU busy and idle time, the longest idle gaps and what the host did in them, kernel categories)."""
    from rlforge.perf.torch_trace import render_markdown, summarize

    out = ""
    for r in runs:
        if r.get("profile_trace"):
            out += f"\n## Profiled step: {r['model']} {r['framework']}\n\n"
            out += render_markdown(summarize(r["profile_trace"], num_gaps=5, top_kernels=12, min_gap_ms=1.0), level=3)
    return out


def _stats(xs: list[float]) -> tuple[float, float, float]:
    """(min, median, max) of ``xs`` (the median of an even count is the mean of the middle two)."""
    v = sorted(xs)
    mid = len(v) // 2
    return v[0], (v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2), v[-1]


def aggregate(reps: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """One row per (model, framework) from ``reps`` (the runs of each repetition, in the same order):
    the repetition with the median s/step (the lower middle one for an even count), plus
    ``reps`` (count) and ``spread``: (min, median, max) of tokens/s, s/step, gen s and train s, the
    mean response length and the generated tokens/s (response tokens per second of ``gen``), over the
    repetitions that finished.  A (model, framework) that failed in every repetition keeps its first error."""
    out = []
    for i, first in enumerate(reps[0]):
        ok = [rep[i] for rep in reps if "error" not in rep[i]]
        if not ok:
            out.append(first)
            continue
        ok_sorted = sorted(ok, key=lambda r: r["s_per_step"])
        row = dict(ok_sorted[(len(ok_sorted) - 1) // 2])
        spread: dict[str, tuple[float, float, float]] = {}
        for key in ("tokens_per_s", "s_per_step", "gen_s", "train_s", "response_length_mean"):
            vals = [r[key] for r in ok if r.get(key) is not None]
            if vals:
                spread[key] = _stats(vals)
        gen_tps = [r["generated_tokens_per_s"] for r in ok if r.get("generated_tokens_per_s") is not None]
        if gen_tps:
            spread["generated_tokens_per_s"] = _stats(gen_tps)
        row.update(reps=len(ok), spread=spread)
        out.append(row)
    return out


def spread_table(rows: list[dict[str, Any]]) -> str:
    """min / median / max over the repetitions of each (model, framework)."""
    keys = (("tokens_per_s", ".0f"), ("s_per_step", ".2f"), ("gen_s", ".2f"), ("train_s", ".2f"),
            ("response_length_mean", ".0f"), ("generated_tokens_per_s", ".0f"))
    head = ["model", "framework", "reps", "tokens/s", "s/step", "gen s", "train s", "mean response tokens",
            "generated tokens/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "spread" not in r:
            continue
        cells = ["/".join(format(v, spec) for v in r["spread"][k]) if k in r["spread"] else "-" for k, spec in keys]
        lines.append(f"| {r['model']} | {r['framework']} | {r['reps']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def with_generated_rate(run: dict[str, Any], wl: Workload) -> dict[str, Any]:
    """``generated_tokens_per_s``: the step's response tokens (prompts x n x mean response length)
    per second of generation, prompt tokens apart."""
    length, gen_s = run.get("response_length_mean"), run.get("gen_s")
    rate = wl.prompts * wl.n * length / gen_s if length and gen_s else None
    return {**run, "generated_tokens_per_s": rate}


def save_weights(model: str, tok: Any, folder: Path) -> Path:
    """One random checkpoint of ``preset:<model>`` (seed 0, float32) in ``folder``, loaded by both
    frameworks, so that they start from the same weights; reused when it is already there."""
    if not (folder / "config.json").exists():
        from rlforge.models import load_causal_lm

        m = load_causal_lm(f"preset:{model}", tok, seed=0)
        m.save_pretrained(folder)
        tok.save_pretrained(folder)
        del m
    return folder


def stage_table(runs: list[dict[str, Any]]) -> str:
    lines = ["| model | framework | stage | s/step | GPU util % |", "|---|---|---|---|---|"]
    for r in runs:
        for stage, s in r.get("stages_s", {}).items():
            util = r.get("stages_gpu_util", {}).get(stage)
            lines.append(f"| {r['model']} | {r['framework']} | {stage} | {s:.3f} | {_f(util, '.1f')} |")
    return "\n".join(lines)


def run_jobs(
    jobs: list[tuple[str, str, Callable[[str | None], dict]]], gpus: list[str],
    on_done: Callable[[list[dict[str, Any]]], None] = lambda runs: None,
) -> list[dict[str, Any]]:
    """Run ``(model, framework, job)`` entries one after another, or, with ``gpus``, one per
    GPU at a time (each run alone on its GPU; the larger models first, so the longest runs
    start first).  Returns the runs in the order given, a failed one as ``{"error": ...}``;
    ``on_done`` gets the runs finished so far (in that order) after each run.  A job is called with
    its GPU id (None without ``gpus``)."""
    results: dict[int, dict[str, Any]] = {}
    lock = threading.Lock()

    def one(i: int, gpu: str | None) -> None:
        model, framework, job = jobs[i]
        try:
            res = {"model": model, "framework": framework, **job(gpu)}
        except (RuntimeError, OSError, ValueError, KeyError) as e:
            print(f"{model} {framework} failed: {e}", file=sys.stderr, flush=True)
            res = {"model": model, "framework": framework, "error": str(e)}
        with lock:
            results[i] = res
            on_done([results[k] for k in sorted(results)])

    if len(gpus) < 2:
        for i in range(len(jobs)):
            one(i, gpus[0] if gpus else None)
        return [results[i] for i in range(len(jobs))]

    def size(model: str) -> float:  # billions of parameters, from the preset name ("qwen2.5-1.5b" -> 1.5)
        found = re.search(r"-([\d.]+)b$", model)
        return float(found.group(1)) if found else 0.0

    todo: queue.Queue[int] = queue.Queue()
    for i in sorted(range(len(jobs)), key=lambda i: (-size(jobs[i][0]), not jobs[i][1].startswith("trl"))):  # TRL: slower
        todo.put(i)
    def worker(gpu: str) -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            one(i, gpu)

    threads = [threading.Thread(target=worker, args=(g,)) for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[i] for i in range(len(jobs))]


def check_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, with one ``p.error`` line, what would only fail inside a run (or measure the wrong thing)."""
    from rlforge.models.presets import PRESETS

    for name in ("steps", "prompts", "n", "prompt_len", "response_len", "micro_batch", "token_budget"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.reps < 1:
        p.error(f"--reps must be >= 1, got {args.reps}")
    bad_setups = [v for v in args.rlforge_setups.split(",") if v not in RLFORGE_SETUPS]
    if bad_setups:
        p.error(f"--rlforge-setups: unknown {bad_setups}; valid: {', '.join(RLFORGE_SETUPS)}")
    bad = [v for v in args.trl_variants.split(",") if v not in TRL_VARIANTS]
    if bad:
        p.error(f"--trl-variants: unknown {bad}; valid: {', '.join(TRL_VARIANTS)}")
    if args.warmup < 0:
        p.error(f"--warmup must be >= 0, got {args.warmup}")
    if not (math.isfinite(args.beta) and args.beta >= 0):
        p.error(f"--beta must be a finite number >= 0, got {args.beta}")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        p.error(f"--out {args.out}: exists and is not a folder")
    if (args.prompts * args.n) % args.micro_batch:
        p.error(f"--micro-batch {args.micro_batch} must divide prompts x n = {args.prompts * args.n}")
    if args.n < 2:
        p.error(f"--n must be >= 2 (GRPO normalises rewards within each prompt's group), got {args.n}")
    if args.token_budget < args.prompt_len + args.response_len:
        p.error(f"--token-budget {args.token_budget} is below one sequence (--prompt-len + --response-len = "
                f"{args.prompt_len + args.response_len})")
    if args.lengths == "lognormal" and args.rlforge_rollout != "native":
        p.error("--lengths lognormal imposes lengths through the native engine's test hook: keep --rlforge-rollout "
                "native")
    if args.lengths == "lognormal" and not args.skip_trl and "trl-cb" in args.trl_variants.split(","):
        p.error("--lengths lognormal imposes TRL's lengths on plain generate: drop trl-cb from --trl-variants")
    if len(set(args.models)) != len(args.models):
        p.error(f"--models lists a model twice: {args.models}")
    unknown = [m for m in args.models if m.removeprefix("preset:") not in PRESETS]
    if unknown:
        p.error(f"--models: unknown preset(s) {unknown}; valid: {', '.join(PRESETS)}")
    if args.gpus is not None:
        ids = args.gpus.split(",")
        if not args.gpus or any(not i.strip().isdigit() or i != i.strip() for i in ids):
            p.error(f"--gpus {args.gpus!r}: expected distinct GPU numbers separated by commas, e.g. 0,1")
        if len({int(i) for i in ids}) != len(ids):
            p.error(f"--gpus {args.gpus!r}: a GPU is listed twice (two runs would share it and both be timed as alone)")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), help="preset names (without 'preset:')")
    p.add_argument("--steps", type=int, default=5, help="measured steps per run (after the warm-up)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured steps first")
    p.add_argument("--skip-trl", action="store_true", help="run rlforge only")
    p.add_argument("--skip-rlforge", action="store_true",
                   help="run TRL only (e.g. on another GPU of the machine, in parallel with an rlforge-only run)")
    p.add_argument("--rlforge-rollout", choices=("hf", "native"), default="native")
    p.add_argument("--token-budget", type=int, default=16384,
                   help="rlforge's ppo_max_token_len_per_gpu and log_prob_max_token_len_per_gpu")
    p.add_argument("--tokenizer", default=None, help="tokenizer folder (actor_rollout_ref.model.tokenizer_path)")
    p.add_argument("--out", default="e2e_grpo_out", help="output folder")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--response-len", type=int, default=1024)
    p.add_argument("--lengths", choices=("fixed", "lognormal"), default="fixed",
                   help="response lengths: fixed (EOS only where sampled) or lognormal (the long-tail workload)")
    p.add_argument("--micro-batch", type=int, default=16, help="sequences per forward/backward, both frameworks")
    p.add_argument("--beta", type=float, default=0.0, help="KL coefficient (0 = no reference model)")
    p.add_argument("--rlforge-extra", nargs="*", default=[], help="extra rlforge overrides, key=value")
    p.add_argument("--profile", action="store_true",
                   help="one more step after the measured ones under torch.profiler, in both frameworks; the table "
                        "gets each trace's summary (GPU busy/idle, idle gaps and their host side, kernel categories)")
    p.add_argument("--run-time-limit", type=float, default=None,
                   help="seconds per framework run; a run still going then is stopped and its table row is computed "
                        "from the measured steps it completed (the steps column says how many)")
    p.add_argument("--gpus", default=None,
                   help="comma-separated GPU ids (e.g. 0,1): run the (model, framework) runs side by side, one per GPU "
                        "at a time, each alone on its GPU; default: one after another on the visible GPU")
    p.add_argument("--rlforge-setups", default="rlforge",
                   help=f"comma-separated rlforge rows: {', '.join(RLFORGE_SETUPS)} (rlforge-auto: as a user runs it, "
                   "every lever auto)")
    p.add_argument("--trl-variants", default="trl-fast,trl-cb",
                   help=f"comma-separated TRL setups, each its own row: {', '.join(TRL_VARIANTS)}")
    p.add_argument("--reps", type=int, default=3,
                   help="interleaved repetitions of every run (the table shows the median one; min/median/max apart)")
    p.add_argument("--no-same-weights", action="store_true",
                   help="let each framework build the preset's random weights itself instead of loading one saved "
                        "random checkpoint (OUT/weights/<model>)")
    p.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--trl-variant", default="trl", help=argparse.SUPPRESS)
    p.add_argument("--weights", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workload", default=None, help=argparse.SUPPRESS)
    p.add_argument("--data", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if not args.trl_worker:
        check_args(p, args)
    out = Path(args.out).resolve()
    if args.trl_worker:
        out.mkdir(parents=True, exist_ok=True)
        return trl_worker(args.trl_worker, Workload(**json.loads(args.workload)), Path(args.data), out, args.tokenizer,
                          args.trl_variant, Path(args.weights) if args.weights else None)
    wl = Workload(prompts=args.prompts, n=args.n, prompt_len=args.prompt_len, response_len=args.response_len,
                  micro_batch=args.micro_batch, token_budget=args.token_budget, beta=args.beta, steps=args.steps,
                  warmup=args.warmup, profile=args.profile, lengths=args.lengths)
    from rlforge.errors import RLForgeError
    from rlforge.models import load_tokenizer

    try:
        tok = load_tokenizer("preset:tiny", args.tokenizer)
    except RLForgeError as e:
        p.error(f"--tokenizer: {e}")
    out.mkdir(parents=True, exist_ok=True)
    data, reward = write_inputs(out, tok, wl)
    from rlforge.models.presets import preset_config

    def with_mfu(run: dict[str, Any], framework: str, model: str, gpu: str | None) -> dict[str, Any]:
        config = preset_config(model, len(tok))  # the shapes both frameworks build
        return {**run, **mfu_three_ways(run, framework, config, wl, gpu_peak_flops(gpu), args.rlforge_extra)}

    variants = [] if args.skip_trl else args.trl_variants.split(",")
    both = not args.skip_rlforge and bool(variants)
    weights = {m: save_weights(m, tok, out / "weights" / m) if both and not args.no_same_weights else None
               for m in (m.removeprefix("preset:") for m in args.models)}

    def rep_jobs(rep_out: Path) -> list[tuple[str, str, Callable[[str | None], dict]]]:
        rep_out.mkdir(parents=True, exist_ok=True)
        jobs: list[tuple[str, str, Callable[[str | None], dict]]] = []
        for model, w in weights.items():
            for setup in ([] if args.skip_rlforge else args.rlforge_setups.split(",")):
                jobs.append((model, setup, lambda gpu, m=model, w=w, su=setup: with_generated_rate(with_mfu(
                    run_rlforge(m, wl, args, rep_out, data, reward, gpu, w, su), su, m, gpu), wl)))
            for v in variants:
                jobs.append((model, v, lambda gpu, m=model, v=v, w=w: with_generated_rate(with_mfu(
                    run_trl(m, wl, args, rep_out, data, gpu, v, w), v, m, gpu), wl)))
        return jobs

    done: list[list[dict[str, Any]]] = []  # the finished repetitions
    per_rep = len(weights) * ((0 if args.skip_rlforge else len(args.rlforge_setups.split(","))) + len(variants))

    def write(runs: list[dict[str, Any]]) -> str:
        """The tables of the finished repetitions and ``runs`` (the one in progress) into
        OUT/e2e_grpo.{md,json} (after every run, so a run cut short by its machine still leaves the
        finished runs' table)."""
        complete = [r for r in done + [runs] if len(r) == per_rep]
        rows = aggregate(complete) if complete else runs
        md = (f"{markdown_table(rows)}\n\nRepetitions: min/median/max over {len(complete)}\n\n"
              f"{spread_table(rows)}\n")
        md += f"\nStage breakdown (mean per measured step):\n\n{stage_table(rows)}\n"
        runs = rows
        md += profile_sections(runs)
        overheads = [r["sampler_overhead"] for r in runs if r.get("sampler_overhead") is not None]
        if overheads:
            md += (f"\nGPU sampler CPU time: at most {100 * max(overheads):.3f} % of wall time "
                   f"({'within' if max(overheads) < 0.01 else 'OVER'} the 1 % budget)\n")
        (out / "e2e_grpo.md").write_text(md)
        (out / "e2e_grpo.json").write_text(json.dumps({"workload": asdict(wl), "rollout": args.rlforge_rollout,
                                                       "tokenizer": args.tokenizer, "runs": runs,
                                                       "repetitions": done}, indent=1))
        return md

    for rep in range(args.reps):
        runs = run_jobs(rep_jobs(out / f"rep{rep + 1}"), args.gpus.split(",") if args.gpus else [], on_done=write)
        done.append(runs)
    print("\n" + write([]), flush=True)
    return 0 if all("error" not in r for rep in done for r in rep) else 1


if __name__ == "__main__":
    sys.exit(main())

"""FlowRL vs GRPO on matching a multimodal reward distribution, through the real trainer.

Reproduces the toy experiment of Zhu et al. 2025, "FlowRL: Matching Reward Distributions
for LLM Reasoning" (§5): the policy answers a fixed prompt with an integer x in 1..100 and
gets reward log p*(x), with p* a three-mode Gaussian mixture (``builtin:distribution``).
Reward-maximising GRPO collapses onto the central mode; FlowRL with β = 1, the raw reward
and no reference term has the target exp(βr) = p* and covers all modes.

Both algorithms run through ``rlforge train`` (in-process CLI) with the same budget:
steps, samples per step, learning rate and schedule.  The policy is ``preset:tiny`` from
random init with the ``builtin:integers`` tokenizer (each integer one token) and responses
of exactly one token, so π(x) is the softmax probability of token x and every KL below is
exact, computed from the checkpoints the trainer saves every ``--eval-every`` steps.

    python benchmarks/distribution_matching.py [--seed 1] [--steps 300]
        [--weights 0.25,0.5,0.25 --means 20,50,80 --width 10] [--out DIR] [--plot FILE.png]

Prints: algorithm, step, forward KL(p*‖π), reverse KL(π‖p*) over 1..100, mass off 1..100,
and the number of modes holding more than 10% of their target mass.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from rlforge.cli import main as rlforge_main
from rlforge.data.tasks.distribution import target_probs
from rlforge.models import load_causal_lm, load_tokenizer

PROMPT = [{"role": "user", "content": "Pick a number."}]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--steps", type=int, default=300, help="RL steps per algorithm")
    p.add_argument("--eval-every", type=int, default=50, help="steps between KL evaluations")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step (data.train_batch_size)")
    p.add_argument("--n", type=int, default=64, help="samples per prompt (rollout.n)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weights", default="0.25,0.5,0.25")
    p.add_argument("--means", default="20,50,80")
    p.add_argument("--width", type=float, default=10.0)
    p.add_argument("--algorithms", default="flowrl,grpo")
    p.add_argument("--out", default=None, help="folder for checkpoints and metrics (default: a temp folder)")
    p.add_argument("--plot", default="distribution_matching.png", help="PNG of p* and the final policies ('' = none)")
    return p.parse_args(argv)


def floats(text: str) -> list[float]:
    return [float(t) for t in text.split(",") if t.strip()]


def overrides(args: argparse.Namespace, algorithm: str, out_dir: Path) -> list[str]:
    """The CLI overrides of one run; the two algorithms differ only in the loss."""
    n_seq = args.prompts * args.n
    common = [
        "actor_rollout_ref.model.path=preset:tiny",
        "actor_rollout_ref.model.tokenizer_path=builtin:integers",
        "data.train_files=builtin:distribution",
        "data.val_files=null",
        f"data.builtin.train_size={args.prompts * args.steps}",
        f"data.builtin.distribution.weights=[{args.weights}]",
        f"data.builtin.distribution.means=[{args.means}]",
        f"data.builtin.distribution.width={args.width}",
        "data.max_prompt_length=16",
        "data.max_response_length=1",
        f"data.train_batch_size={args.prompts}",
        f"data.seed={args.seed}",
        f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.temperature=1.0",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={n_seq}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={n_seq}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}",
        "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.save_freq={args.eval_every}",
        # full checkpoints (actor/state.pt, read by policy_probs), not the default job's [hf_model]-only save
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.resume_mode=disable",
        "trainer.logger=[file]",
        f"trainer.default_local_dir={out_dir}",
    ]
    if algorithm == "flowrl":
        return common + [
            "actor_rollout_ref.actor.policy_loss.loss_mode=flowrl",
            "actor_rollout_ref.actor.policy_loss.flowrl.beta=1.0",
            "actor_rollout_ref.actor.policy_loss.flowrl.reward=raw",
            "actor_rollout_ref.actor.policy_loss.flowrl.use_ref=false",
        ]
    if algorithm == "grpo":
        return common + ["actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"]
    raise SystemExit(f"unknown algorithm {algorithm!r}; use flowrl and/or grpo")


def policy_probs(ckpt: Path, tokenizer, low: int, high: int, seed: int) -> tuple[np.ndarray, float]:
    """π(x) for x = low..high from a checkpoint, and the mass on every other token."""
    model = load_causal_lm("preset:tiny", tokenizer, seed=seed)
    from rlforge.trainer.dcp_io import saved_model_state

    state = saved_model_state(ckpt)  # sharded (actor/.metadata) or full (actor/state.pt)
    if any(k.startswith("lm.") for k in state):  # FlowRL: PolicyWithLogZ = lm + log_z_head
        state = {k[3:]: v for k, v in state.items() if k.startswith("lm.")}
    model.load_state_dict(state)
    model.eval()
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].double()
    probs = torch.softmax(logits, -1).numpy()
    tok = [tokenizer.convert_tokens_to_ids(str(x)) for x in range(low, high + 1)]
    pi = probs[tok]
    return pi, float(1.0 - pi.sum())


def kl_stats(p_star: np.ndarray, pi: np.ndarray, means: list[float], low: int) -> tuple[float, float, int]:
    """Forward KL(p*‖π), reverse KL(π‖p*) (over 1..100, π unnormalised), modes covered."""
    tiny = 1e-300
    fwd = float(np.sum(p_star * (np.log(p_star + tiny) - np.log(pi + tiny))))
    rev = float(np.sum(pi * (np.log(pi + tiny) - np.log(p_star + tiny))))
    xs = np.arange(low, low + len(p_star))
    nearest = np.argmin(np.abs(xs[:, None] - np.asarray(means)[None, :]), axis=1)
    covered = sum(
        int(pi[nearest == k].sum() > 0.1 * p_star[nearest == k].sum()) for k in range(len(means))
    )
    return fwd, rev, covered


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    weights, means = floats(args.weights), floats(args.means)
    spec = {"weights": weights, "means": means, "width": args.width, "low": 1, "high": 100, "invalid_reward": -50.0}
    p_star = target_probs(spec)
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="rlforge-dist-"))
    tokenizer = load_tokenizer("preset:tiny", "builtin:integers")
    rows: list[tuple[str, int, float, float, float, int]] = []
    finals: dict[str, np.ndarray] = {}
    for alg in args.algorithms.split(","):
        out = root / f"{alg}-seed{args.seed}"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        rc = rlforge_main(["train", *overrides(args, alg, out)])
        if rc != 0:
            return rc
        print(f"{alg}: {args.steps} steps in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        for step in range(args.eval_every, args.steps + 1, args.eval_every):
            pi, off = policy_probs(out / f"global_step_{step}", tokenizer, 1, 100, args.seed)
            fwd, rev, covered = kl_stats(p_star, pi, means, 1)
            rows.append((alg, step, fwd, rev, off, covered))
            finals[alg] = pi
    print(f"\nseed {args.seed}, target weights {weights} means {means} width {args.width}")
    print(f"{'algorithm':<10} {'step':>5} {'fwd KL(p*||pi)':>15} {'rev KL(pi||p*)':>15} {'mass off 1..100':>16} "
          f"{'modes>10%':>9}")
    for alg, step, fwd, rev, off, covered in rows:
        print(f"{alg:<10} {step:>5} {fwd:>15.3f} {rev:>15.3f} {off:>16.4f} {covered:>6}/{len(means)}")
    if args.plot:
        plot(p_star, finals, args.plot, args.seed)
    if not args.out:
        shutil.rmtree(root, ignore_errors=True)
    return 0


def plot(p_star: np.ndarray, finals: dict[str, np.ndarray], path: str, seed: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib); no plot written", file=sys.stderr)
        return
    xs = np.arange(1, len(p_star) + 1)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.plot(xs, p_star, "k-", lw=2, label="target p*")
    for alg, pi in finals.items():
        ax.plot(xs, pi, "o-", ms=2.5, lw=1, label=f"{alg} (final)")
    ax.set_xlabel("x")
    ax.set_ylabel("probability")
    ax.set_title(f"Matching a multimodal reward distribution (seed {seed})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot written to {os.path.abspath(path)}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())

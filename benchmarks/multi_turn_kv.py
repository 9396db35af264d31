"""Multi-turn rollout throughput: keeping each sequence's KV cache across turns vs re-prefilling the history.

    python benchmarks/multi_turn_kv.py                          # qwen2.5-0.5b on the GPU (issue 18's row)
    python benchmarks/multi_turn_kv.py --model tiny --device cpu --batch 4 --turns 3 --turn-tokens 8   # smoke

Workload (random-weight ``preset:`` model, bf16 on CUDA, sampling at T = 1, EOS off): ``--batch``
conversations of a ``--prompt-len``-token random prompt; each has ``--turns`` model turns of exactly
``--turn-tokens`` tokens (``multi_turn.max_tokens_per_turn``), and after each turn but the last a
scripted interaction inserts the user turn "Continue." rendered by the chat template (an EOS closing the
model's turn + the template's user turn + the generation prompt).  The same seeded workload runs through
:class:`~rlforge.rollout.multi_turn.native.MultiTurnNativeRollout` with ``reuse_kv=True`` (an inserted turn
is prefilled on top of the cached history) and ``reuse_kv=False`` (the sequence's blocks are freed at each
turn boundary and prompt + history + inserted turn are prefilled again; prompt blocks may still hit the
prefix cache, as they would in an engine that re-submits every turn).

Columns: model tok/s (sampled tokens over generation wall time), all tok/s (sampled + inserted), prefill
tokens (tokens fed that were not decodes), gen s, and the speed-up of KV reuse.  One warm-up run of each
mode on a slice of the batch first (CUDA graphs, allocator); then ``--reps`` repetitions of each mode,
interleaved (reuse, re-prefill, reuse, ...); the table shows each mode's median repetition by gen s and
the min/median/max of its model tok/s.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from rlforge.batch import Batch
from rlforge.interactions import BaseInteraction
from rlforge.models import load_causal_lm, load_tokenizer
from rlforge.models.presets import PRESETS
from rlforge.rollout import SamplingParams
from rlforge.rollout.multi_turn.config import MultiTurnConfig
from rlforge.rollout.multi_turn.native import MultiTurnNativeRollout


class Continue(BaseInteraction):
    """Always asks for more: the user turn is "Continue."."""

    async def generate_response(self, instance_id, messages, **kwargs):
        return False, "Continue.", 0.0, {}


def prompts(n: int, length: int, vocab: int, seed: int) -> Batch:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(100, vocab - 100, (n, length), generator=g)
    mask = torch.ones_like(ids)
    return Batch.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(1) - 1})


def run(model, tok, batch: Batch, args, reuse_kv: bool, device: torch.device) -> dict[str, float]:
    mt = MultiTurnConfig(enable=True, max_tokens_per_turn=args.turn_tokens, max_assistant_turns=args.turns)
    ro = MultiTurnNativeRollout(model, [tok.eos_token_id], tok.pad_token_id, device, progress=False, seed=0,
                                ignore_eos=True, max_num_seqs=args.max_num_seqs, max_num_batched_tokens=16384,
                                tokenizer=tok, multi_turn=mt, interactions={"c": Continue({})}, reuse_kv=reuse_kv)
    budget = args.turns * (args.turn_tokens + 32)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = ro.generate(batch, SamplingParams(temperature=1.0, max_new_tokens=budget))
    if device.type == "cuda":
        torch.cuda.synchronize()
    m = ro.metrics()
    model_tokens = int(out["response_mask"].sum())
    all_tokens = int(out["attention_mask"][:, batch["input_ids"].shape[1]:].sum())
    assert model_tokens == len(batch) * args.turns * args.turn_tokens, (model_tokens, "turns cut short")
    return {"reuse_kv": reuse_kv, "seconds": time.perf_counter() - t, "gen_s": m["rollout/gen_s"],
            "model_tokens": model_tokens, "all_tokens": all_tokens,
            "model_tok_s": model_tokens / m["rollout/gen_s"], "all_tok_s": all_tokens / m["rollout/gen_s"],
            "prefill_tokens": m["rollout/prefill_tokens"], "num_turns_mean": m["num_turns/mean"],
            "preemptions": m["rollout/num_preemptions"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-0.5b", choices=sorted(PRESETS))
    ap.add_argument("--tokenizer", default=None, help="tokenizer folder (default: rlforge's for preset:MODEL)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--turn-tokens", type=int, default=128)
    ap.add_argument("--max-num-seqs", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each mode (median shown)")
    ap.add_argument("--json", default=None, help="also write the rows here")
    args = ap.parse_args()
    device = torch.device(args.device)
    tok = load_tokenizer(f"preset:{args.model}", args.tokenizer)
    model = load_causal_lm(f"preset:{args.model}", tok, seed=0)
    model = model.to(device=device, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32).eval()
    vocab = min(model.get_input_embeddings().weight.shape[0], len(tok))
    batch = prompts(args.batch, args.prompt_len, vocab, seed=0)
    warm = prompts(max(1, min(8, args.batch)), args.prompt_len, vocab, seed=1)
    for reuse in (True, False):
        run(model, tok, warm, args, reuse, device)
    reps: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(max(1, args.reps)):
        for reuse in (True, False):
            reps[reuse].append(run(model, tok, batch, args, reuse, device))
    rows = [sorted(reps[reuse], key=lambda r: r["gen_s"])[len(reps[reuse]) // 2] for reuse in (True, False)]
    print(f"# {args.model} on {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}: "
          f"{args.batch} conversations x {args.turns} turns x {args.turn_tokens} model tokens, prompt {args.prompt_len}")
    print(f"{'mode':<12}{'model tok/s':>14}{'all tok/s':>12}{'prefill tok':>13}{'gen s':>9}{'preempt':>9}")
    for r in rows:
        print(f"{'kv reuse' if r['reuse_kv'] else 're-prefill':<12}{r['model_tok_s']:>14.0f}{r['all_tok_s']:>12.0f}"
              f"{r['prefill_tokens']:>13.0f}{r['gen_s']:>9.2f}{r['preemptions']:>9.0f}")
    for reuse in (True, False):
        rates = sorted(r["model_tok_s"] for r in reps[reuse])
        print(f"{'kv reuse' if reuse else 're-prefill'}: model tok/s min/median/max over {len(rates)} reps: "
              f"{rates[0]:.0f} / {rates[len(rates) // 2]:.0f} / {rates[-1]:.0f}")
    print(f"kv reuse / re-prefill (model tok/s, medians): {rows[0]['model_tok_s'] / rows[1]['model_tok_s']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"median": rows, "reps": {"kv_reuse": reps[True], "re_prefill": reps[False]}}, f, indent=1)


if __name__ == "__main__":
    main()

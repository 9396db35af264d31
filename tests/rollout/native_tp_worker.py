"""Worker of ``test_native_tp.py``: one rank of a 2-rank gloo group running the native rollout with
``tp=2`` next to a ``tp=None`` (today's path) reference computed in the same process.

``python native_tp_worker.py <out_dir>``; every rank writes ``out_dir/rank{r}.pt`` with, per case,
its own rows of the TP=2 batch and the same rows of the reference batch.
"""

from __future__ import annotations

import copy
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/: helpers
sys.path.insert(0, str(HERE.parent / "distributed"))  # dist_common

TEXTS = ["What is 2 + 3?", "Compute the sum of seven and eleven, then subtract four from it please.", "Hi",
         "Name three colours."]
KEYS = ("responses", "response_mask", "input_ids", "attention_mask", "position_ids", "rollout_log_probs")


def _own(batch, rank: int):
    """Rank 0: rows 0-2, rank 1: row 3 (uneven on purpose: the union's offsets are exercised)."""
    return batch.select(slice(0, 3) if rank == 0 else slice(3, 4))


def _rows(out) -> dict:
    return {k: out[k].clone() for k in KEYS}


def main(out_dir: Path) -> None:
    import dist_common as dc
    import torch.distributed as dist
    from helpers import text_prompts

    import rlforge.engine.fsdp2  # noqa: F401 - registers "fsdp2"
    from rlforge.engine import ENGINES
    from rlforge.engine.distributed import init_distributed
    from rlforge.rollout import SamplingParams
    from rlforge.rollout.native import NativeRollout
    from rlforge.rollout.native.tensor_parallel import new_tp_group
    from rlforge.trainer.builders.policy import Policy
    from rlforge.trainer.builders.rollout import rollout_sync

    info = init_distributed("cpu")
    model, tok = dc.load_model()
    model.eval()
    cpu = torch.device("cpu")
    greedy = SamplingParams(do_sample=False, max_new_tokens=10)
    full = text_prompts(tok, TEXTS)

    def native(module, tp=None, **kw):
        return NativeRollout(module, [tok.eos_token_id], tok.pad_token_id, cpu, progress=False, block_size=4,
                             calculate_log_probs=True, tp=tp, **kw)

    ref_copy, tp_copy = copy.deepcopy(model), copy.deepcopy(model)
    ref, tp = native(ref_copy), native(tp_copy, tp=new_tp_group(2))
    rank = info.rank
    res: dict = {"q_shape": tuple(tp_copy.model.layers[0].self_attn.q_proj.weight.shape)}
    # 1. greedy, uneven rows per rank
    mine = _own(full, rank)
    res["plain"] = (_rows(tp.generate(mine, greedy)), _rows(_own(ref.generate(full, greedy), rank)))
    # 2. prefix sharing: every prompt 4 times
    rep = full.repeat_interleave(4)
    mine4 = rep.select(slice(0, 12) if rank == 0 else slice(12, 16))
    out = tp.generate(mine4, greedy)
    res["prefix_hits"] = tp.last_stats.prefix_hit_blocks
    whole = ref.generate(rep, greedy)
    res["prefix"] = (_rows(out), _rows(whole.select(slice(0, 12) if rank == 0 else slice(12, 16))))
    # 3. one actor update through the FSDP2 engine, then the trainer's weight sync (each rank its slice)
    engine = ENGINES.get("fsdp2")(model.train(), info.device, optim_cfg=dc.actor_cfg().optim, total_steps=10,
                                  grad_clip=1.0)
    batch = dc.make_batch(model, tok)
    dc.run_actor(engine, batch.select(slice(rank * 3, rank * 3 + 3)), "seq-mean-token-mean", 3)
    policy = Policy(SimpleNamespace(engine=engine), model, tp_copy, tp_copy, "", None)  # what the sync reads
    rollout_sync(policy, tp.weight_slices())()
    engine.sync_to(ref_copy)
    res["changed"] = float((ref_copy.model.layers[0].mlp.down_proj.weight - model_before(dc)).abs().max())
    res["synced"] = (_rows(tp.generate(mine, greedy)), _rows(_own(ref.generate(full, greedy), rank)))
    # 4. sampling: the group samples alike (checked inside generate), every rank gets its own rows
    sampled = tp.generate(mine, SamplingParams(do_sample=True, temperature=1.0, max_new_tokens=10))
    res["sampled_rows"] = sampled["responses"].shape[0]
    torch.save(res, out_dir / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def model_before(dc) -> torch.Tensor:
    """Layer 0's ``down_proj`` weight of a fresh model (before the update)."""
    return dc.load_model()[0].model.layers[0].mlp.down_proj.weight.detach()


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.path.insert(0, str(HERE.parents[1]))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]))

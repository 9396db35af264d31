"""Worker of ``test_sample_shards``: one prompt with ``n = 4`` responses (``data.train_batch_size=1``),
shared between the ranks as the trainer shares it (:class:`rlforge.trainer.sample_shards.StepSharding`):
one process holds all 4 samples, each of 2 ranks holds 2.  Each computes the GRPO advantages (the
group statistics over the whole gathered batch) and takes one actor step (FSDP2) on its own rows.
Rank 0 saves the advantages of every sample, the step's metrics and the updated weights.

Run as ``python shard_worker.py <out_dir> <json options>`` once per rank (``run_ranks``), or call
:func:`run` in-process for the one-process reference.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).parent)]  # this checkout's rlforge
import dist_common as dc  # noqa: E402

SCORES = [1.0, 0.0, 0.0, 1.0]  # one group: mean 0.5, unbiased std sqrt(1/3)


def run(out: Path, opts: dict) -> None:
    import numpy as np
    import torch.distributed as dist

    from rlforge.algorithms.advantages import ADV_ESTIMATORS, AdvantageInputs
    from rlforge.config import AlgorithmConfig
    from rlforge.config.common import FSDPConfig
    from rlforge.config.sharding import BatchLayout
    from rlforge.engine import ENGINES
    from rlforge.engine.distributed import init_distributed, init_single_process
    from rlforge.trainer.sample_shards import StepSharding

    cpu = torch.device("cpu")
    info = init_distributed("cpu") if "WORLD_SIZE" in os.environ else init_single_process(cpu)
    model, tok = dc.load_model()
    full = dc.left_padded_batch(tok.pad_token_id, dc.EOS, [4, 4, 4, 4], [1, 5, None, 3], 6)
    rmask = full["response_mask"].float()
    last = (rmask.cumsum(1) == rmask.sum(1, keepdim=True)) & (rmask > 0)
    full["token_level_rewards"] = last.float() * torch.tensor(SCORES)[:, None]
    full.non_tensor["uid"] = np.array(["p0"] * 4, dtype=object)
    lay = BatchLayout(num_prompts=1, n=4, world=info.world_size, dp=info.world_size)
    shards = StepSharding(lay, info.rank)
    assert shards.whole_prompts == (info.world_size == 1)
    mine = full.select(shards.indices)
    with torch.no_grad():
        from rlforge.roles.forward import response_log_probs

        logp, _ = response_log_probs(model.eval(), mine, dc.TEMPERATURE, with_entropy=False)
    model.train()
    mine["old_log_probs"] = logp * mine["response_mask"].float()
    mine["ref_log_prob"] = mine["old_log_probs"]
    inputs = AdvantageInputs(token_level_rewards=mine["token_level_rewards"],
                             response_mask=mine["response_mask"].float(), index=mine.non_tensor["uid"])
    adv, _ = shards.advantages(ADV_ESTIMATORS.get("grpo"), inputs, AlgorithmConfig())
    mine["advantages"] = adv
    cfg = dc.actor_cfg(opts["mode"])
    engine = ENGINES.get("fsdp2")(model, info.device, fsdp_config=FSDPConfig(), optim_cfg=cfg.optim, total_steps=10,
                                  grad_clip=cfg.grad_clip)
    metrics, _ = dc.run_actor(engine, mine, opts["mode"], micro=1)
    advs = [None] * info.world_size
    dist.all_gather_object(advs, adv)
    state = engine.state_dict()
    if info.rank == 0:
        torch.save({"adv": torch.cat(advs), "metrics": metrics, "state": state["model"], "world": info.world_size},
                   out / "result.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(Path(sys.argv[1]), json.loads(sys.argv[2]))

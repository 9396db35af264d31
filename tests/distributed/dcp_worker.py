"""Worker of the sharded-checkpoint tests (tests/distributed/test_dcp_checkpoint.py): FSDP2 actor steps on
``preset:tiny`` with the real :class:`~rlforge.trainer.checkpointer.Checkpointer` and the real resume path
(:func:`~rlforge.trainer.dcp_io.load_into`).

``python dcp_worker.py CASE OUT JSON`` per rank (dist_common.run_ranks) or alone (one-rank group).  Step ``k``
trains on the rows of a fixed 12-row batch chosen by ``k`` (the data position: a resumed run must continue at
the saved step), this rank's share of them; then the LR schedule steps.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dist_common import EOS, TEMPERATURE, actor_cfg, load_model  # noqa: E402
from helpers import left_padded_batch  # noqa: E402

ROWS = 12


def full_batch(model, tok):
    """12 left-padded sequences with old/ref log-probs and advantages (seeded)."""
    from rlforge.roles.forward import response_log_probs

    b = left_padded_batch(tok.pad_token_id, EOS, [2, 7, 4, 5, 3, 6, 5, 2, 7, 3, 4, 6],
                          [0, 7, 3, None, 5, 1, 2, 6, None, 4, 0, 3], 8)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        logp, _ = response_log_probs(model.eval(), b, TEMPERATURE, with_entropy=False)
    model.train()
    rmask = b["response_mask"].float()
    b["old_log_probs"] = (logp + (torch.rand(logp.shape, generator=g) - 0.5) * 0.1) * rmask
    b["ref_log_prob"] = (logp + (torch.rand(logp.shape, generator=g) - 0.5) * 0.2) * rmask
    b["advantages"] = torch.randn(logp.shape, generator=g) * rmask
    return b


def step_rows(step: int) -> torch.Tensor:
    """The 12 row indices of step ``step`` (a seeded permutation: each step sees the rows in another order)."""
    return torch.randperm(ROWS, generator=torch.Generator().manual_seed(100 + step))


def slow_writes(seconds: float) -> None:
    """Make every DCP file write wait ``seconds`` first (the test's stand-in for a large, slow save)."""
    from torch.distributed.checkpoint import FileSystemWriter

    original = FileSystemWriter.write_data

    def write_data(self, plan, planner):
        time.sleep(seconds)
        return original(self, plan, planner)

    FileSystemWriter.write_data = write_data


def main(out: Path, opts: dict) -> None:
    import torch.distributed as dist

    from rlforge.engine import ENGINES
    from rlforge.engine.distributed import init_distributed, init_single_process
    from rlforge.roles.actor import Actor
    from rlforge.trainer import checkpoint as ckpt
    from rlforge.trainer.checkpointer import Checkpointer, Role
    from rlforge.trainer.dcp_io import load_into

    info = init_distributed("cpu") if "WORLD_SIZE" in os.environ else init_single_process(torch.device("cpu"))
    rank, world = info.rank, info.world_size
    model, tok = load_model()
    batch = full_batch(model, tok)
    cfg = actor_cfg()
    engine = ENGINES.get("fsdp2")(model, info.device, optim_cfg=cfg.optim, total_steps=10, grad_clip=cfg.grad_clip)
    actor = Actor(engine, cfg, mini_batch_size=ROWS // world, micro_batch_size=2, log_prob_micro_batch_size=2)
    saver = Checkpointer(rank)
    step = 0
    if opts.get("resume"):
        path = Path(opts["resume"])
        load_into(engine, path / "actor", "actor_rollout_ref.model")
        step = int(ckpt.load_part(path, "trainer_state")["global_step"])
    if opts.get("slow_s"):
        slow_writes(opts["slow_s"])
    rows = []
    while step < opts["until"]:
        step += 1
        share = step_rows(step).view(world, -1)[rank]
        m = actor.update(batch.select(share), TEMPERATURE).metrics
        lr = engine.lr_scheduler_step()
        rows.append({"step": step, "pg_loss": float(m["pg_loss"]), "grad_norm": float(m["grad_norm"]), "lr": lr})
        if step == opts.get("save_at"):
            saver.save(out / "run", step, {"actor": Role(engine, bool(opts.get("async")))}, {"global_step": step},
                       config="{}\n")
            if opts.get("async") and rank == 0:
                tracker = out / "run" / ckpt.TRACKER
                rows[-1]["tracker_after_save"] = tracker.read_text() if tracker.exists() else None
                print("STAGED", flush=True)
            if opts.get("hang_after_save"):
                time.sleep(600)
    saver.close()
    state = engine.state_dict()
    if rank == 0:
        torch.save({"rows": rows, "state": state, "world": world}, out / "result.pt")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(Path(sys.argv[1]), json.loads(sys.argv[2]))

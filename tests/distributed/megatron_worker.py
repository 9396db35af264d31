"""Worker and launcher of the ``strategy=megatron`` gloo tests (CPU, fp32, tiny Llama).

``launch(world, out_dir, opts)`` runs this file once per rank as a plain subprocess (RANK /
WORLD_SIZE / MASTER_* set, as torchrun does).  Each rank takes its share of dist_common's
6-row batch (as the trainer would), builds the megatron engine and, through the real actor
loss, computes: log-probs and entropy before the update, the loss metrics and the full
gradients of one mini-batch, the gradient norm and the optimizer step, the log-probs after
the step, the full state dict, a ``sync_to`` copy and a reload of the state into a fresh
engine.  Rank 0 saves everything to ``out_dir/result.pt``.  ``launch_cases`` runs several cases
in one launch (``out_dir/NAME/result.pt`` each).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import dist_common as dc  # noqa: E402


def launch(world: int, out_dir: Path, opts: dict, timeout: float = 300.0) -> None:
    """Run the worker on ``world`` gloo ranks; raise with the ranks' stderr on failure."""
    dc.run_ranks([__file__, str(out_dir), json.dumps(opts)], world, timeout)


def launch_cases(world: int, out_dir: Path, cases: dict, timeout: float) -> None:
    """Run every case of ``cases`` (name -> options) in turn in one ``world``-rank launch, one
    process group for all of them (the imports cost ~5-10 s of CPU per process, more than a case's
    step); case NAME writes ``out_dir/NAME/result.pt``.  A failing case ends the launch (the cases
    after it have no result); raise with the ranks' stderr."""
    dc.run_ranks([__file__, str(out_dir), json.dumps({"cases": cases})], world, timeout)


def load_model(layers: int = 2):
    """dist_common's tiny Llama, with ``layers`` decoder layers."""
    from rlforge.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer("preset:tiny")
    over = {"initializer_range": 0.2, **({"num_hidden_layers": layers} if layers != 2 else {})}
    return load_causal_lm("preset:tiny", tok, over, seed=3), tok


def rows_of(rank: int, world: int) -> slice:
    """This rank's contiguous share of the ROWS rows (the first ranks take one more when uneven)."""
    base, extra = divmod(dc.ROWS, world)
    start = rank * base + min(rank, extra)
    return slice(start, start + base + (1 if rank < extra else 0))


def _engine(model, info, opts: dict):
    from rlforge.config.common import MegatronConfig
    from rlforge.engine import ENGINES

    mcfg = MegatronConfig(tensor_model_parallel_size=opts.get("tp", 1), pipeline_model_parallel_size=opts.get("pp", 1),
                          virtual_pipeline_model_parallel_size=opts.get("vpp"),
                          sequence_parallel=opts.get("sp", False), param_offload=opts.get("param_offload", False),
                          optimizer_offload=opts.get("optimizer_offload", False))
    cfg = dc.actor_cfg(opts["mode"])
    return ENGINES.get("megatron")(
        model, info.device, megatron_config=mcfg, optim_cfg=cfg.optim, total_steps=10, grad_clip=cfg.grad_clip,
        gradient_checkpointing=opts.get("ckpt", False),
    )


def _gather_rows(t: torch.Tensor, world: int) -> torch.Tensor:
    import torch.distributed as dist

    parts = [None] * world
    dist.all_gather_object(parts, t)
    return torch.cat(parts)


def main(out: Path, opts: dict, leave_group: bool = True) -> None:
    import torch.distributed as dist

    from rlforge.batch import Batch
    from rlforge.engine.distributed import init_distributed
    from rlforge.roles.actor import Actor

    info = init_distributed("cpu")
    layers = opts.get("layers", 2)
    model, tok = load_model(layers)
    batch = dc.make_batch(model, tok)
    mine = batch.select(rows_of(info.rank, info.world_size))
    engine = _engine(model, info, opts)
    cfg = dc.actor_cfg(opts["mode"])
    budget = opts.get("budget")
    actor = Actor(engine, cfg, mini_batch_size=len(mine), micro_batch_size=opts["micro"], log_prob_micro_batch_size=2,
                  max_token_len=budget, log_prob_max_token_len=budget)
    before = actor.compute_log_prob(mine, dc.TEMPERATURE, with_entropy=True)
    keys = ["prompts", "input_ids", "attention_mask", "position_ids", "responses", "response_mask",
            "old_log_probs", "advantages", "ref_log_prob"]
    data = Batch(mine.tensors.select(*keys), {}, {})
    metrics = engine.accumulate_grads(data, actor._loss_fn(dc.TEMPERATURE), opts["micro"], budget)
    grads = dict(engine.full_grads_iter("cpu"))
    metrics["grad_norm"] = engine.apply_grads()
    after = actor.compute_log_prob(mine, dc.TEMPERATURE)["log_probs"]
    state = engine.state_dict()
    synced, _ = load_model(layers)
    engine.sync_to(synced)
    result = {
        "logp_before": _gather_rows(before["log_probs"], info.world_size),
        "entropy_before": _gather_rows(before["entropys"], info.world_size),
        "metrics": metrics, "grads": grads, "logp": _gather_rows(after, info.world_size), "state": state,
        "synced": synced.state_dict(), "engine_metrics": engine.metrics(),
    }
    path = out / "state.pt"
    if info.rank == 0:
        torch.save(state, path)
    dist.barrier()
    fresh = _engine(load_model(layers)[0], info, opts)
    fresh.load_state_dict(torch.load(path, weights_only=False))
    result["reloaded_state"] = fresh.state_dict()
    if info.rank == 0:
        torch.save(result, out / "result.pt")
    dist.barrier()
    if leave_group:
        dist.destroy_process_group()


def critic_batch(batch):
    """dist_common's batch with the critic's inputs: old values and returns."""
    g = torch.Generator().manual_seed(1)
    mask = batch["response_mask"].float()
    batch["values"] = torch.randn(mask.shape, generator=g) * 0.1 * mask
    batch["returns"] = torch.randn(mask.shape, generator=g) * mask
    return batch


def critic_main(out: Path, opts: dict, leave_group: bool = True) -> None:
    """The value model: values before the update, the value-loss metrics and full gradients."""
    import torch.distributed as dist

    from rlforge.config import CriticConfig
    from rlforge.engine.distributed import init_distributed
    from rlforge.models import load_value_model
    from rlforge.roles.critic import Critic

    info = init_distributed("cpu")
    model, tok = dc.load_model()
    batch = critic_batch(dc.make_batch(model, tok))
    critic_model = load_value_model("preset:tiny", tok, {"initializer_range": 0.2}, seed=3)
    engine = _engine(critic_model, info, opts)
    cfg = CriticConfig()
    cfg.loss_agg_mode, cfg.ppo_epochs = opts["mode"], 1
    critic = Critic(engine, cfg, len(batch), opts["micro"], 2)
    mine = batch.select(rows_of(info.rank, info.world_size))
    values = critic.compute_values(mine)
    captured: dict = {}

    class Capture:  # an engine whose step only accumulates: the update's loss and gradients are kept
        lr = 0.0

        def phase(self):  # the engine contract's phase context (param_offload); nothing to move here
            return contextlib.nullcontext()

        def train_step(self, data, loss_fn, micro, budget=None):
            captured["metrics"] = engine.accumulate_grads(data, loss_fn, micro, budget)
            captured["grads"] = dict(engine.full_grads_iter("cpu"))
            return {**captured["metrics"], "grad_norm": 0.0}

    critic.engine = Capture()
    critic.update(mine)
    result = {"values": _gather_rows(values, info.world_size), **captured}
    if info.rank == 0:
        torch.save(result, out / "result.pt")
    dist.barrier()
    if leave_group:
        dist.destroy_process_group()


def run_cases(out: Path, cases: dict) -> None:
    """:func:`launch_cases`'s worker: each case in ``out/NAME``, in this rank's one process group."""
    import torch.distributed as dist

    for name, opts in cases.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        (critic_main if opts.get("critic") else main)(out / name, opts, leave_group=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    options = json.loads(sys.argv[2])
    if "cases" in options:
        run_cases(Path(sys.argv[1]), options["cases"])
    else:
        (critic_main if options.get("critic") else main)(Path(sys.argv[1]), options)

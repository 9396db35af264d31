"""Shared fixtures of the 2-rank gloo tests, and the worker entry point.

The tests launch ``python dist_common.py <case> <out_dir> <json options>`` once per rank
as plain subprocesses (RANK/WORLD_SIZE/MASTER_* in the environment, as torchrun sets
them); rank 0 writes its results to ``out_dir`` with ``torch.save``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers (also for worker scripts)
from helpers import left_padded_batch  # noqa: E402

EOS = 2
TEMPERATURE = 0.9
ROWS = 6
WORLD = 2


def load_model():
    from rlforge.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer("preset:tiny", os.environ.get("RLFORGE_TEST_TOKENIZER") or None)
    return load_causal_lm("preset:tiny", tok, {"initializer_range": 0.2}, seed=3), tok


def local_engine(model):
    """The single-process reference engine with the actor config's optimizer and schedule."""
    from reference_engine import LocalEngine

    from rlforge.engine import build_optimizer, build_scheduler

    cfg = actor_cfg("seq-mean-token-mean")
    opt = build_optimizer([p for p in model.parameters() if p.requires_grad], cfg.optim)
    sched = build_scheduler(opt, cfg.optim, 10, "optim")
    return LocalEngine(model, torch.device("cpu"), opt, sched, grad_clip=cfg.grad_clip)


def close_states(a: dict, b: dict, atol: float = 1e-5) -> None:
    """Assert two state dicts hold the same keys and close tensors."""
    assert set(a) == set(b)
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), atol=atol, rtol=1e-5), (k, (a[k] - b[k]).abs().max())


def close_optim(a: dict, b: dict) -> None:
    """Assert two optimizer state dicts match (same groups, close per-parameter state)."""
    assert len(a["state"]) == len(b["state"]) and len(a["param_groups"]) == len(b["param_groups"])
    for i, s in a["state"].items():
        for k, v in s.items():
            assert torch.allclose(torch.as_tensor(v).float(), torch.as_tensor(b["state"][i][k]).float(),
                                  atol=1e-6, rtol=1e-4), (i, k)


def make_batch(model, tok):
    """6 sequences, left-padded prompts of 2..7 tokens, responses with 1..8 valid tokens."""
    from rlforge.roles.forward import response_log_probs

    b = left_padded_batch(tok.pad_token_id, EOS, [2, 7, 4, 5, 3, 6], [0, 7, 3, None, 5, 1], 8)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        logp, _ = response_log_probs(model.eval(), b, TEMPERATURE, with_entropy=False)
    model.train()
    rmask = b["response_mask"].float()
    b["old_log_probs"] = (logp + (torch.rand(logp.shape, generator=g) - 0.5) * 0.1) * rmask
    b["ref_log_prob"] = (logp + (torch.rand(logp.shape, generator=g) - 0.5) * 0.2) * rmask
    b["advantages"] = torch.randn(logp.shape, generator=g) * rmask
    return b


def actor_cfg(mode: str = "seq-mean-token-mean"):
    from rlforge.config import ActorConfig

    cfg = ActorConfig()
    cfg.loss_agg_mode = mode
    cfg.grad_clip = 1.0
    cfg.use_kl_loss = True
    cfg.kl_loss_coef = 0.5
    cfg.kl_loss_type = "low_var_kl"
    cfg.entropy_coeff = 0.01
    cfg.optim.lr = 1e-3
    return cfg


def run_actor(engine, batch, mode: str, micro: int, chunk: int = 0):
    """One optimizer step through the real actor loss; returns (metrics, log-probs of ``batch``).
    ``chunk``: the chunked LM head's chunk size (0 = the model's full logits)."""
    from rlforge.roles.actor import Actor

    actor = Actor(engine, actor_cfg(mode), mini_batch_size=len(batch), micro_batch_size=micro,
                  log_prob_micro_batch_size=2, head_chunk_size=chunk)
    metrics = actor.update(batch, TEMPERATURE).metrics
    logp = actor.compute_log_prob(batch, TEMPERATURE)["log_probs"]
    return metrics, logp


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(argv: list[str], world: int, timeout: float) -> None:
    """Run ``python *argv`` once per rank on ``world`` gloo ranks (RANK / WORLD_SIZE / MASTER_*
    set, as torchrun does); raise with the failing ranks' stderr."""
    port = _free_port()
    procs = []
    for rank in range(world):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, *argv], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    errors = []
    for rank, p in enumerate(procs):
        try:
            _, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            errors.append(f"rank {rank} timed out:\n{err[-4000:]}")
            continue
        if p.returncode != 0:
            errors.append(f"rank {rank} exit {p.returncode}:\n{err[-4000:]}")
    if errors:
        raise RuntimeError("\n".join(errors))


def launch(case: str, out_dir: Path, opts: dict, timeout: float = 120.0) -> None:
    """Run ``case`` on ``WORLD`` gloo ranks; raise with the ranks' stderr on failure."""
    run_ranks([__file__, case, str(out_dir), json.dumps(opts)], WORLD, timeout)


def _case_train(out: Path, opts: dict, leave_group: bool = True) -> None:
    """One actor step on this rank's half of the batch; rank 0 saves metrics, the full state,
    a ``sync_to`` copy, and (fsdp2) the state re-loaded into a fresh engine.  ``leave_group``:
    destroy the process group at the end (False: :func:`_case_train_many` runs the next case in it)."""
    import torch.distributed as dist

    import rlforge.engine.fsdp1  # noqa: F401 - registers "fsdp"
    import rlforge.engine.fsdp2  # noqa: F401 - registers "fsdp2"
    from rlforge.config.common import FSDPConfig
    from rlforge.engine import ENGINES
    from rlforge.engine.distributed import init_distributed

    info = init_distributed("cpu")
    model, tok = load_model()
    batch = make_batch(model, tok)
    half = ROWS // info.world_size
    mine = batch.select(slice(info.rank * half, (info.rank + 1) * half))
    cfg = actor_cfg(opts["mode"])
    fsdp_cfg = FSDPConfig(forward_prefetch=opts.get("prefetch", False))

    def make_engine(module):
        return ENGINES.get(opts["strategy"])(
            module, info.device, fsdp_config=fsdp_cfg, optim_cfg=cfg.optim, total_steps=10,
            grad_clip=cfg.grad_clip, gradient_checkpointing=opts.get("ckpt", False),
            activation_offload=opts.get("offload", False),
        )

    engine = make_engine(model)
    metrics, logp = run_actor(engine, mine, opts["mode"], opts["micro"], opts.get("chunk", 0))
    head = engine.module.get_output_embeddings().weight
    root_resharded = type(head).__name__ == "DTensor"  # FSDP2: infer reshards the root at the end
    state = engine.state_dict()
    synced, _ = load_model()
    engine.sync_to(synced)
    logps = [None] * info.world_size
    dist.all_gather_object(logps, logp)
    result = {"metrics": metrics, "state": state, "synced": synced.state_dict(), "logp": torch.cat(logps),
              "root_resharded": root_resharded}
    if opts.get("reload"):
        path = out / "state.pt"
        if info.rank == 0:
            torch.save(state, path)
        dist.barrier()
        fresh = make_engine(load_model()[0])
        fresh.load_state_dict(torch.load(path, weights_only=False))
        result["reloaded"] = dict(fresh.full_params_iter("cpu"))
        result["reloaded_state"] = fresh.state_dict()
    if info.rank == 0:
        torch.save(result, out / "result.pt")
    dist.barrier()
    if leave_group:
        dist.destroy_process_group()


def _case_train_many(out: Path, cases: dict) -> None:
    """Every ``train`` case of ``cases`` (name -> options) in turn, in one process group: one
    interpreter start per rank for all of them (the imports cost ~5-10 s of CPU per process, more
    than a case's step).  Case NAME writes ``out/NAME/result.pt``; a failing case ends the launch,
    so the cases after it have no result."""
    import torch.distributed as dist

    for name, opts in cases.items():
        (out / name).mkdir(parents=True, exist_ok=True)
        _case_train(out / name, opts, leave_group=False)
    dist.destroy_process_group()


def _case_steps(out: Path, opts: dict) -> None:
    """``opts["steps"]`` actor steps through the FSDP engine on this rank's share of the batch.
    Without ``WORLD_SIZE`` in the environment the process joins a one-rank group in-process
    (``init_single_process``), as ``rlforge train`` does on one device.  Rank 0 saves the
    per-step metrics, the full state and whether the optimizer state was host-resident."""
    import torch.distributed as dist

    from rlforge.config.common import FSDPConfig
    from rlforge.engine import ENGINES
    from rlforge.engine.distributed import init_distributed, init_single_process

    cpu = torch.device("cpu")
    info = init_distributed("cpu") if "WORLD_SIZE" in os.environ else init_single_process(cpu)
    model, tok = load_model()
    batch = make_batch(model, tok)
    half = ROWS // info.world_size
    mine = batch.select(slice(info.rank * half, (info.rank + 1) * half))
    cfg = actor_cfg(opts["mode"])
    fsdp_cfg = FSDPConfig(optimizer_offload=opts.get("optimizer_offload", False))
    if opts.get("lora"):  # a LoRA adapter of this rank (model.lora_rank), seeded as rlforge.models.lora does
        from types import SimpleNamespace

        from rlforge.models.lora import apply_lora

        apply_lora(model, SimpleNamespace(lora_rank=opts["lora"], lora_alpha=8, target_modules="all-linear",
                                          exclude_modules=None, lora_adapter_path=None), "model", "preset:tiny")
    engine = ENGINES.get(opts["strategy"])(model, info.device, fsdp_config=fsdp_cfg, optim_cfg=cfg.optim,
                                           total_steps=10, grad_clip=cfg.grad_clip,
                                           gradient_checkpointing=opts.get("ckpt", False),
                                           trainable_state_only=bool(opts.get("lora")))
    per_step, offloaded = [], []
    for _ in range(opts["steps"]):
        per_step.append(run_actor(engine, mine, opts["mode"], opts["micro"])[0])
        offloaded.append(engine.offloaded is not None and engine.offloaded.is_offloaded()
                         and all(local.device.type == "cpu" for local in engine.offloaded.host.values()))
    state = engine.state_dict()
    if info.rank == 0:
        torch.save({"metrics": per_step, "state": state, "offloaded": offloaded,
                    "num_host": len(engine.offloaded.host) if engine.offloaded else 0,
                    "world": info.world_size}, out / "result.pt")
    dist.barrier()
    dist.destroy_process_group()


def run_single(argv: list[str], timeout: float) -> None:
    """Run ``python *argv`` as one plain process (no launcher variables); raise with its stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    res = subprocess.run([sys.executable, *argv], env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True,
                         text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"exit {res.returncode}:\n{res.stderr[-4000:]}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    worker = {"train": _case_train, "train_many": _case_train_many, "steps": _case_steps}[sys.argv[1]]
    worker(Path(sys.argv[2]), json.loads(sys.argv[3]))

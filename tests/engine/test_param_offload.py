"""``fsdp_config.param_offload`` in verl's meaning: the parameters wait on the CPU between phases
(:mod:`rlforge.engine.param_offload`), for FSDP1 and FSDP2.

On this CPU machine the engines are given the offload directly (:func:`enable_param_offload`; a run
with ``trainer.device=cpu`` leaves it off with one warning): every move is a real copy to new
storage, so the test sees the parameters leave and come back, and an update over several
micro-batches (gradient accumulation, which FSDP1's ``CPUOffload`` gets wrong) must give
bit-identical losses, log-probs and weights.  The CUDA test checks the devices themselves.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import dist_common as dc  # noqa: E402

CPU = torch.device("cpu")
MODE = "seq-mean-token-mean"


def _storages(engine) -> list[torch.Tensor]:
    """The engine's parameter tensors (FSDP1: the flat parameters' local shards; FSDP2: the local
    shards).  The caller holds them, so their memory cannot be reused by a later move."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    if engine.strategy == "fsdp":
        units = FullyShardedDataParallel.fsdp_modules(engine.module)
        return [u._handle.flat_param.data for u in units if u._handle is not None]
    return [(p.to_local() if isinstance(p, DTensor) else p).data for p in engine.module.parameters()]


def _shared(a: list[torch.Tensor], b: list[torch.Tensor]) -> set[int]:
    return {t.data_ptr() for t in a} & {t.data_ptr() for t in b}


def _engine(strategy: str, device: torch.device = CPU, **fsdp):
    from rlforge.config.common import FSDPConfig
    from rlforge.engine import ENGINES
    from rlforge.engine.distributed import init_single_process

    init_single_process(device)
    model, tok = dc.load_model()
    batch = dc.make_batch(model, tok)
    cfg = dc.actor_cfg()
    engine = ENGINES.get(strategy)(model, device, fsdp_config=FSDPConfig(**fsdp), optim_cfg=cfg.optim,
                                   total_steps=10, grad_clip=cfg.grad_clip)
    return engine, batch


def _run(engine, batch) -> tuple[dict, torch.Tensor, dict[str, torch.Tensor]]:
    metrics, logp = dc.run_actor(engine, batch, MODE, micro=3)  # several micro-batches per step
    params = {k: v.detach().float().clone() for k, v in engine.full_params_iter(CPU)}
    return metrics, logp, params


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_param_offload_is_bit_identical_and_moves_between_phases(strategy):
    from rlforge.engine.sharded import enable_param_offload

    plain_metrics, plain_logp, plain_params = _run(*_engine(strategy))

    engine, batch = _engine(strategy)
    assert engine.param_offload is None  # a CPU device: nothing to offload to
    off = enable_param_offload(engine)
    assert off.offloaded and off.moves == 1
    host = _storages(engine)
    with engine.phase():
        assert not off.offloaded
        inside = _storages(engine)
        assert not _shared(inside, host)  # new storage: the parameters were copied in
        with engine.phase():  # reentrant: no move inside a phase
            assert off.moves == 2
    assert off.offloaded and off.moves == 3 and not _shared(_storages(engine), inside)

    moves = off.moves
    metrics, logp, params = _run(engine, batch)
    assert off.offloaded and off.depth == 0  # back on the host after the update, the log-probs, the gather
    # update (one phase for all its steps), compute_log_prob, full_params_iter: 3 phases = 6 moves
    assert off.moves == moves + 6
    assert metrics["pg_loss"] == plain_metrics["pg_loss"] and metrics["grad_norm"] == plain_metrics["grad_norm"]
    assert torch.equal(logp, plain_logp)
    assert set(params) == set(plain_params)
    for name, value in plain_params.items():
        assert torch.equal(params[name], value), name


def test_offload_back_on_the_host_after_an_error():
    from rlforge.engine.param_offload import ParamOffload

    where: list[str] = []
    off = ParamOffload(lambda dest: where.append(dest.type), torch.device("cpu"))
    off.offload()
    with pytest.raises(RuntimeError), off.phase():
        raise RuntimeError("boom")
    assert off.offloaded and where == ["cpu", "cpu", "cpu"]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
def test_param_offload_on_cuda_keeps_weights_on_the_cpu_between_phases(strategy):
    cuda = torch.device("cuda")
    plain_metrics, _, plain_params = _run(*_engine(strategy, cuda))
    engine, batch = _engine(strategy, cuda, param_offload=True)
    assert engine.param_offload is not None and engine.param_offload.offloaded

    def devices() -> set[str]:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if strategy == "fsdp":
            units = FullyShardedDataParallel.fsdp_modules(engine.module)
            return {u._handle.flat_param.device.type for u in units if u._handle is not None}
        return {p.device.type for p in engine.module.parameters()}

    assert devices() == {"cpu"}
    with engine.phase():
        assert devices() == {"cuda"}
    metrics, _, params = _run(engine, batch)
    assert devices() == {"cpu"}
    torch.testing.assert_close(metrics["pg_loss"], plain_metrics["pg_loss"])
    for name, value in plain_params.items():
        torch.testing.assert_close(params[name], value, msg=name)

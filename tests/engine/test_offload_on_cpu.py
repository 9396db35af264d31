"""``param_offload`` / ``offload_policy`` on a CPU device: nothing to offload to, so the engines run
without offload (FSDP's CPU offload pins memory, which needs an accelerator: building the engine
used to fail with "Cannot access accelerator device when none is available").  The config check
warns once (tests/config/test_precision.py); here the engine trains exactly as without offload.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import dist_common as dc  # noqa: E402

CPU = torch.device("cpu")


def _one_step(strategy: str, **offload: bool) -> dict[str, torch.Tensor]:
    from rlforge.config.common import FSDPConfig
    from rlforge.engine import ENGINES
    from rlforge.engine.distributed import init_single_process

    init_single_process(CPU)
    model, tok = dc.load_model()
    batch = dc.make_batch(model, tok)
    cfg = dc.actor_cfg()
    engine = ENGINES.get(strategy)(model, CPU, fsdp_config=FSDPConfig(**offload), optim_cfg=cfg.optim,
                                   total_steps=10, grad_clip=cfg.grad_clip)
    metrics, _ = dc.run_actor(engine, batch, "seq-mean-token-mean", micro=6)
    assert torch.isfinite(torch.tensor(metrics["pg_loss"]))
    return {k: v.detach().float().clone() for k, v in engine.full_params_iter(CPU)}


@pytest.mark.parametrize("strategy", ["fsdp2", "fsdp"])
@pytest.mark.parametrize("key", ["param_offload", "offload_policy"])
def test_offload_on_cpu_trains_as_without_offload(strategy, key):
    plain = _one_step(strategy)
    offloaded = _one_step(strategy, **{key: True, "optimizer_offload": True})
    assert set(plain) == set(offloaded)
    for name, value in plain.items():
        torch.testing.assert_close(offloaded[name], value, atol=0, rtol=0, msg=name)

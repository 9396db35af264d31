"""One engine for 1 and N processes: ``strategy=fsdp2`` in one plain process (this one, in a
one-rank group made in-process, as ``rlforge train`` does on one device) against the same
engine on 2 gloo ranks, each with half of the batch.  Two optimizer steps; the per-step losses and gradient
norms and the parameters afterwards must agree to 1e-5.  With ``optimizer_offload=true`` the
one-process run keeps the AdamW moments in the engine's host buffers between steps and
trains exactly as without it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import dist_common as dc  # noqa: E402

MODE = "seq-mean-token-mean"
OPTS = {"mode": MODE, "micro": 2, "steps": 2, "strategy": "fsdp2"}


def _one_process(tmp: Path, **extra) -> dict:
    """The steps in this process (no ``WORLD_SIZE``: the worker makes a one-rank group in-process
    and destroys it at the end), as test_lora_fsdp2 does: no interpreter start (~5-10 s of CPU)."""
    tmp.mkdir(parents=True, exist_ok=True)
    dc._case_steps(tmp, {**OPTS, **extra})
    return torch.load(tmp / "result.pt", weights_only=False)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    return _one_process(tmp_path_factory.mktemp("one"))


@pytest.mark.e2e
def test_one_process_equals_two(single, tmp_path):
    dc.launch("steps", tmp_path, OPTS)
    two = torch.load(tmp_path / "result.pt", weights_only=False)
    assert (single["world"], two["world"]) == (1, 2)
    for step, (a, b) in enumerate(zip(single["metrics"], two["metrics"], strict=True)):
        for k in ("pg_loss", "kl_loss", "grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-8), (step, k)
    assert single["metrics"][1]["pg_loss"] != single["metrics"][0]["pg_loss"]  # the first step changed the model
    dc.close_states(single["state"]["model"], two["state"]["model"])
    dc.close_optim(single["state"]["optimizer"], two["state"]["optimizer"])


def test_optimizer_offload_keeps_state_on_host(single, tmp_path):
    off = _one_process(tmp_path, optimizer_offload=True)
    assert off["offloaded"] == [True, True]
    assert off["num_host"] == 2 * len(off["state"]["optimizer"]["state"])  # exp_avg and exp_avg_sq each
    assert single["offloaded"] == [False, False]
    for a, b in zip(off["metrics"], single["metrics"], strict=True):
        assert a == pytest.approx(b, rel=1e-6)
    dc.close_states(off["state"]["model"], single["state"]["model"], atol=1e-7)

"""LoRA on FSDP2: one plain process (this one, in a one-rank group, as ``rlforge train`` on one
device) against 2 gloo ranks with half of the batch each, with gradient checkpointing.  Two
optimizer steps; the losses and gradient norms must agree to 1e-5 relative (1e-6 absolute: the
second step's pg_loss is ~0.01, a sum of signed terms, and differs by ~3e-7 in float32), the
adapter weights to 5e-5 absolute, 5% of the lr of 1e-3 (measured 2.3e-6 on a quiet machine and 2.3e-5 in a
loaded CI run: AdamW divides by sqrt(v) + 1e-8, so an element whose gradient is near 1e-8 moves by a sizeable
fraction of lr on summation-order noise alone), and AdamW state to 1e-5."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import dist_common as dc  # noqa: E402

pytestmark = pytest.mark.e2e

OPTS = {"mode": "seq-mean-token-mean", "micro": 2, "steps": 2, "strategy": "fsdp2", "lora": 4, "ckpt": True}


def test_lora_one_process_equals_two(tmp_path):
    (tmp_path / "one").mkdir()
    dc._case_steps(tmp_path / "one", dict(OPTS))  # no WORLD_SIZE here: the one-rank group of one process
    one = torch.load(tmp_path / "one" / "result.pt", weights_only=False)
    dc.launch("steps", tmp_path, OPTS)
    two = torch.load(tmp_path / "result.pt", weights_only=False)
    assert (one["world"], two["world"]) == (1, 2)
    for step, (a, b) in enumerate(zip(one["metrics"], two["metrics"], strict=True)):
        for k in ("pg_loss", "kl_loss", "grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (step, k)
    assert one["metrics"][0]["grad_norm"] > 0
    assert one["metrics"][1]["pg_loss"] != one["metrics"][0]["pg_loss"]  # the first step changed the policy
    state = one["state"]["model"]
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)  # only the adapter is saved
    assert any(float(v.abs().max()) > 0 for k, v in state.items() if ".lora_B." in k)  # B left zero: it trained
    dc.close_states(state, two["state"]["model"], atol=5e-5)
    dc.close_optim(one["state"]["optimizer"], two["state"]["optimizer"])

"""FlowRL's log Z head under bf16 mixed precision (found on an H200: the first FlowRL update failed
with "mat1 and mat2 must have the same dtype, but got Float and BFloat16").

The CPU reproduces the GPU's numerics with ``fsdp_config.mixed_precision.param_dtype=bf16``:
FSDP2 then gathers every parameter in bf16, so a head computing in float32 met bf16 weights.
The head must stay float32 (weights and compute) and take bf16 hidden states.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from rlforge.models.log_z import LogZHead, PolicyWithLogZ

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import dist_common as dc  # noqa: E402

CPU = torch.device("cpu")


def _head() -> LogZHead:
    torch.manual_seed(0)
    head = LogZHead(8, 4)
    torch.nn.init.normal_(head.net[-1].weight)  # not the zero start, so the output depends on the input
    return head


def test_head_takes_bf16_hidden_states_and_answers_in_float32():
    head = _head()
    x = torch.randn(3, 8).to(torch.bfloat16)
    out = head(x)
    assert out.dtype == torch.float32 and out.shape == (3,)
    torch.testing.assert_close(out, head(x.float()), atol=0, rtol=0)  # the same float32 computation


def test_head_ignores_a_bf16_autocast():
    head = _head()
    x = torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = head(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, head(x), atol=0, rtol=0)  # not rounded through bf16


def test_fsdp2_bf16_mixed_precision_trains_the_head_in_float32():
    from rlforge.config.common import FSDPConfig
    from rlforge.engine import ENGINES
    from rlforge.engine.distributed import init_single_process

    init_single_process(CPU)
    model, tok = dc.load_model()
    batch = dc.make_batch(model, tok)
    policy = PolicyWithLogZ(model, 16)
    torch.nn.init.normal_(policy.log_z_head.net[-1].weight, std=0.1)
    before = {k: v.clone() for k, v in policy.log_z_head.state_dict().items()}
    cfg = dc.actor_cfg()
    engine = ENGINES.get("fsdp2")(policy, CPU, fsdp_config=FSDPConfig(mixed_precision={"param_dtype": "bf16"}),
                                  optim_cfg=cfg.optim, total_steps=10)
    module = engine.module
    logits, log_z = module.forward_with_log_z(batch["input_ids"], batch["attention_mask"], batch["position_ids"],
                                              prompt_len=batch["prompts"].shape[1])
    assert logits.dtype == torch.bfloat16  # the LM does compute in bf16
    assert log_z.dtype == torch.float32 and log_z.shape == (batch["input_ids"].shape[0],)
    (log_z.square().sum() + logits.float().mean()).backward()
    engine.optimizer.step()
    after = {k.removeprefix("log_z_head."): v.full_tensor() for k, v in module.state_dict().items()
             if k.startswith("log_z_head.")}
    assert set(after) == set(before)
    for k, v in after.items():
        assert v.dtype == torch.float32, k
        assert torch.isfinite(v).all() and not torch.equal(v, before[k]), k


@pytest.mark.e2e
def test_flowrl_one_step_job_with_bf16_mixed_precision(tmp_path):
    from trainer.test_algorithm_suite_runs import one_step

    row = one_step(tmp_path, "actor_rollout_ref.actor.policy_loss.loss_mode=flowrl",
                   "actor_rollout_ref.actor.strategy=fsdp2",
                   "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=bf16")
    assert math.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0
    assert row["actor/flowrl/weight_mean"] == pytest.approx(1.0, abs=1e-5)

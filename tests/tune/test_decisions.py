"""The decision logic on fake devices (issue 39, point 5)."""

import pytest

from rlforge.errors import ConfigError
from rlforge.tune.device import SPECS, fake_device
from rlforge.tune.plan import Inputs, choose
from rlforge.tune.shapes import model_shape
from rlforge.tune.workload import Workload

E2E = Workload(rows=512, mini_rows=512, prompt_len=256, response_len=1024)  # 64 prompts x 8, 256 + 1024
E2E_7B = Workload(rows=256, mini_rows=256, prompt_len=256, response_len=512)  # 32 x 8, 256 + 512
H200 = SPECS["H200"]


@pytest.mark.parametrize("model", ["qwen2.5-0.5b", "qwen2.5-1.5b"])
def test_small_models_on_an_h200_run_without_checkpointing_and_a_large_budget(model):
    plan = choose(Inputs(model_shape(f"preset:{model}"), E2E, H200))
    lev = plan.chosen.levers
    assert lev.liger and lev.dynamic_bsz and lev.remove_padding and lev.fused_kernels
    assert not lev.checkpointing and not lev.reshard  # one GPU: nothing to reshard for
    assert not lev.optimizer_offload and not lev.param_offload
    assert lev.token_budget >= 32768
    assert plan.chosen.fits and plan.chosen.time.total < plan.default.time.total


def test_seven_b_on_an_h200_offloads_the_optimizer_or_checkpoints():
    plan = choose(Inputs(model_shape("preset:qwen2.5-7b"), E2E_7B, H200))
    lev = plan.chosen.levers
    assert lev.optimizer_offload or lev.checkpointing
    assert not plan.default.fits  # verl's defaults keep 8 bytes of AdamW moments per parameter on the card
    assert plan.chosen.peak_bytes <= 0.85 * H200.memory_bytes


def test_seven_b_on_an_80_gb_card_offloads_parameters_and_optimizer():
    plan = choose(Inputs(model_shape("preset:qwen2.5-7b"), E2E_7B, fake_device(80)))
    lev = plan.chosen.levers
    assert lev.param_offload and lev.optimizer_offload
    assert plan.chosen.peak_bytes <= 0.85 * 80e9


def test_liger_off_where_it_is_not_installed():
    plan = choose(Inputs(model_shape("preset:qwen2.5-0.5b"), E2E, H200, liger_available=False))
    assert not plan.chosen.levers.liger


def test_the_users_levers_are_kept():
    fixed = {"checkpointing": True, "token_budget": 8192}
    plan = choose(Inputs(model_shape("preset:qwen2.5-0.5b"), E2E, H200), fixed)
    assert plan.chosen.levers.checkpointing and plan.chosen.levers.token_budget == 8192
    assert all(c.levers.checkpointing for c in plan.candidates)


def test_a_model_that_cannot_fit_is_one_message_with_the_minimum():
    with pytest.raises(ConfigError) as e:
        choose(Inputs(model_shape("preset:qwen2.5-7b"), E2E_7B, fake_device(16)))
    msg = str(e.value)
    assert "minimum is" in msg and "GB" in msg and "\n" not in msg

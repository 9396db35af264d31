"""``strategy=megatron`` without processes: the size checks (clear ConfigErrors naming the key),
the config-level check, and the stage split (the stages chained in one process are the model)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from rlforge.config import load_config, validate_config
from rlforge.config.common import MegatronConfig
from rlforge.config.parallel_dims import ParallelDims, parallel_dims
from rlforge.engine.megatron.mesh import check_model_fits, global_rank
from rlforge.engine.megatron.stage import StageModule, rank_stage_ids, stage_layer_ids
from rlforge.errors import ConfigError

KEY = "actor_rollout_ref.actor.megatron"


def _cfg(tp: int = 1, pp: int = 1, vpp: int | None = None, sp: bool = True) -> MegatronConfig:
    return MegatronConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                          virtual_pipeline_model_parallel_size=vpp, sequence_parallel=sp)


def test_sizes_and_rank_layout() -> None:
    dims = parallel_dims(_cfg(tp=2, pp=2), 8, KEY)
    assert (dims.tp, dims.pp, dims.dp, dims.vpp, dims.num_stages) == (2, 2, 2, 1, 2)
    assert dims.sequence_parallel
    assert not parallel_dims(_cfg(tp=1, sp=True), 2, KEY).sequence_parallel  # SP only means something with TP
    # ("pp", "dp", "tp"), tp innermost: tensor-parallel ranks are neighbours
    assert [global_rank(dims, 0, 0, t) for t in range(2)] == [0, 1]
    assert global_rank(dims, 0, 1, 0) == 2 and global_rank(dims, 1, 0, 0) == 4


@pytest.mark.parametrize(
    ("cfg", "world", "needle"),
    [
        (_cfg(tp=4, pp=2), 4, f"{KEY}.tensor_model_parallel_size=4 x {KEY}.pipeline_model_parallel_size=2 = 8 "
                              "does not divide the world size 4"),
        (_cfg(tp=3), 4, "= 3 does not divide the world size 4"),
        (_cfg(pp=1, vpp=2), 2, f"{KEY}.virtual_pipeline_model_parallel_size=2 needs {KEY}.pipeline_model_parallel_size > 1"),
        (_cfg(tp=0), 2, f"{KEY}.tensor_model_parallel_size=0: must be >= 1"),
    ],
)
def test_world_size_errors_name_the_key(cfg, world, needle) -> None:
    with pytest.raises(ConfigError) as e:
        parallel_dims(cfg, world, KEY)
    assert needle in str(e.value)


MODEL = SimpleNamespace(num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960, num_hidden_layers=28)


@pytest.mark.parametrize(
    ("dims", "needle"),
    [
        (ParallelDims(tp=8, pp=1, dp=1), f"{KEY}.tensor_model_parallel_size=8 does not divide the model's 12 attention heads"),
        (ParallelDims(tp=4, pp=1, dp=1), f"{KEY}.tensor_model_parallel_size=4 does not divide the model's 2 KV heads"),
        (ParallelDims(tp=1, pp=3, dp=1), f"{KEY}.pipeline_model_parallel_size=3 = 3 stages do not divide the model's "
                                         "28 decoder layers"),
        (ParallelDims(tp=1, pp=2, dp=1, vpp=4), f"{KEY}.pipeline_model_parallel_size=2 x "
                                                f"{KEY}.virtual_pipeline_model_parallel_size=4 = 8 stages"),
    ],
)
def test_model_size_errors_name_the_key(dims, needle) -> None:
    with pytest.raises(ConfigError) as e:
        check_model_fits(dims, MODEL, KEY)
    assert needle in str(e.value)


def test_model_that_fits() -> None:
    check_model_fits(ParallelDims(tp=2, pp=2, dp=1, vpp=7), MODEL, KEY)


def test_config_validation_checks_the_launched_world() -> None:
    base = ["actor_rollout_ref.actor.strategy=megatron", "trainer.n_gpus_per_node=4"]
    validate_config(load_config([*base, f"{KEY}.tensor_model_parallel_size=2", f"{KEY}.pipeline_model_parallel_size=2"]))
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size=3 .* does not divide the world size 4"):
        validate_config(load_config([*base, f"{KEY}.tensor_model_parallel_size=3"]))
    with pytest.raises(ConfigError, match=r"critic.megatron.pipeline_model_parallel_size=8"):
        validate_config(load_config([*base, "algorithm.adv_estimator=gae", "critic.strategy=megatron",
                                     "critic.megatron.pipeline_model_parallel_size=8"]))


@pytest.mark.e2e
def test_cli_reports_a_bad_mesh_without_a_traceback() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "rlforge.cli", "train", "trainer.device=cpu", "trainer.n_gpus_per_node=2",
         "actor_rollout_ref.actor.strategy=megatron", f"{KEY}.tensor_model_parallel_size=4"],
        capture_output=True, text=True, timeout=120,
    )
    assert res.returncode == 2
    assert f"{KEY}.tensor_model_parallel_size=4" in res.stderr and "Traceback" not in res.stderr


def test_stage_assignment() -> None:
    assert [list(stage_layer_ids(8, 4, s)) for s in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert rank_stage_ids(1, 2, 3) == [1, 3, 5]  # interleaved "loop" placement


def test_stages_chained_equal_the_model() -> None:
    from rlforge.models import load_causal_lm, load_tokenizer

    tok = load_tokenizer("preset:tiny")
    model = load_causal_lm("preset:tiny", tok, {"num_hidden_layers": 4}, seed=0).eval()
    ids = torch.randint(100, 1000, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        x = ids
        for s in range(2):
            x = StageModule(model, stage_layer_ids(4, 2, s), s == 0, s == 1, torch.float32)(x, mask, pos)
    assert torch.allclose(x, ref, atol=1e-5)
    keys = set(StageModule(model, stage_layer_ids(4, 2, 1), False, True, torch.float32).state_dict())
    assert keys == {k for k in model.state_dict() if ".layers.2." in k or ".layers.3." in k
                    or k in ("model.norm.weight", "lm_head.weight")}

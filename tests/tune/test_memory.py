"""The memory model against hand-computed cases (issue 39, point 2)."""

import pytest

from rlforge.tune.device import fake_device
from rlforge.tune.levers import Levers
from rlforge.tune.memory import layer_activation_bytes, stage_memory
from rlforge.tune.shapes import ModelShape, model_shape
from rlforge.tune.workload import Layout, Workload

# preset:tiny with a 100-token vocabulary: h 64, f 128, 2 layers, 4 heads of 16, 2 KV heads, tied, no biases
TINY = model_shape("preset:tiny", min_vocab=100)


def test_tiny_preset_shape_and_parameters_by_hand():
    assert TINY == ModelShape(64, 2, 4, 2, 16, 128, 100, True, False)
    layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64  # Q, K+V, O, gated MLP, 2 norms
    assert TINY.layer_params == layer == 36992
    assert TINY.params == 2 * 36992 + 100 * 64 + 64  # + embedding (tied head) + final norm


def test_qwen_parameter_counts_match_the_published_ones():
    assert model_shape("preset:qwen2.5-0.5b").params == 494_032_768  # Qwen2.5-0.5B: 0.49B
    assert model_shape("preset:qwen2.5-7b").params == 7_615_616_512  # Qwen2.5-7B: 7.61B


def test_activation_bytes_per_token_by_hand():
    # 2*(3h + 2kv) + 2h + 8f + 8h ; liger: ... + 6f + 4h
    assert layer_activation_bytes(TINY, liger=False) == 2 * (192 + 64) + 128 + 1024 + 512 == 2176
    assert layer_activation_bytes(TINY, liger=True) == 2 * (192 + 64) + 128 + 768 + 256 == 1664


def test_update_stage_by_hand_no_checkpointing():
    wl = Workload(rows=8, mini_rows=8, prompt_len=16, response_len=16, chunk_size=32)
    lev = Levers(dynamic_bsz=True, token_budget=256, checkpointing=False, reshard=False)
    m = stage_memory(TINY, wl, lev, fake_device(80))["update_actor"].parts
    p = TINY.params
    assert m["actor weights"] == 4 * p and m["actor optimizer"] == 8 * p and m["rollout weights"] == 2 * p
    assert m["gradients"] == 4 * p
    assert m["gathered weights"] == 2 * p  # every layer gathered without reshard
    assert m["activations"] == 2 * 2176 * 256 + 4 * 64 * 256
    assert m["LM head"] == 32 * 100 * 10  # one chunk: bf16 logits + two float32 buffers


def test_checkpointing_offload_and_sharding_by_hand():
    wl = Workload(rows=8, mini_rows=8, prompt_len=16, response_len=16, layout=Layout(world=2, fsdp=2))
    lev = Levers(dynamic_bsz=True, token_budget=256, checkpointing=True, optimizer_offload=True, reshard=True)
    m = stage_memory(TINY, wl, lev, fake_device(80))["update_actor"].parts
    p = TINY.params
    assert m["actor weights"] == 4 * p / 2 and m["actor optimizer"] == 0 and m["optimizer chunk"] == 8 * p / 2
    assert m["gathered weights"] == 2 * (TINY.root_params + 2 * TINY.layer_params)
    assert m["activations"] == 2 * 2 * 64 * 256 + 2176 * 256 + 4 * 64 * 256  # inputs kept + one layer recomputed


def test_gen_kv_cache_is_every_row_at_full_length_unless_capped():
    wl = Workload(rows=8, mini_rows=8, prompt_len=16, response_len=16)
    gen = stage_memory(TINY, wl, Levers(), fake_device(80))["gen"].parts
    assert gen["KV cache"] == 8 * 32 * (2 * 2 * 32 * 2)  # rows x tokens x (K,V x layers x kv_dim x bf16)
    assert gen["sampling scratch"] == 2 * 8 * 100 * 4
    tiny_dev = fake_device(1e-5)  # 10 kB: the cap leaves nothing
    assert stage_memory(TINY, wl, Levers(), tiny_dev)["gen"].parts["KV cache"] == 0


@pytest.mark.parametrize("keep", [False, True])
def test_a_kept_kv_cache_stays_in_the_training_stages(keep):
    wl = Workload(rows=8, mini_rows=8, prompt_len=16, response_len=16)
    stages = stage_memory(TINY, wl, Levers(free_cache_engine=not keep), fake_device(80))
    assert ("idle rollout cache" in stages["update_actor"].parts) is keep


def test_the_stages_that_run():
    wl = Workload(rows=8, mini_rows=8, prompt_len=16, response_len=16, old_log_prob=True, ref=True, critic=True)
    assert set(stage_memory(TINY, wl, Levers(), fake_device(80))) == {
        "gen", "old_log_prob", "ref", "values", "update_critic", "update_actor"}


def test_one_point_five_b_hand_tuned_is_near_the_measured_104_gb():
    """The issue's H200 measurement: 1.5B, liger, no checkpointing, no reshard, 32k budget peaked at 104.4 GB."""
    wl = Workload(rows=512, mini_rows=512, prompt_len=256, response_len=1024)
    lev = Levers(dynamic_bsz=True, token_budget=32768, liger=True, checkpointing=False, reshard=False,
                 remove_padding=True)
    got = stage_memory(model_shape("preset:qwen2.5-1.5b"), wl, lev, fake_device(150))["update_actor"].total / 1e9
    assert abs(got - 104.4) / 104.4 < 0.10


@pytest.mark.parametrize("t", [2, 4])
def test_rollout_tensor_parallel_gen_by_hand(t):
    """A rollout group of t ranks: 1/t of the weights and packed copies per rank, the group's t x 8 rows of KV
    split over min(t, 2 KV heads) ranks (tiny has 2 KV heads: with t=4 each KV head sits on two ranks)."""
    wl = Workload(rows=8, mini_rows=8, prompt_len=16, response_len=16, layout=Layout(world=t, fsdp=t, rollout_tp=t))
    gen = stage_memory(TINY, wl, Levers(), fake_device(80))["gen"].parts
    assert gen["rollout weights"] == 2 * TINY.params / t
    assert gen["packed rollout weights"] == 2 * TINY.packed_params / t
    assert gen["KV cache"] == t * 8 * 32 * (2 * 2 * 32 * 2) / min(t, 2)
    assert gen["sampling scratch"] == 2 * (8 * t) * 100 * 4


def test_rollout_tp_for_gpus_plans_by_hand():
    from rlforge.tune.cli import rollout_tp_for
    from rlforge.tune.device import SPECS

    h200 = SPECS["H200"]  # 2 x (P + packed) bf16 must take at most half of its memory
    assert rollout_tp_for(model_shape("preset:qwen2.5-7b"), h200, 8) == 1  # 28 GB
    assert rollout_tp_for(model_shape("preset:qwen2.5-32b"), h200, 8) == 2  # 125 GB / 2
    assert rollout_tp_for(model_shape("preset:qwen2.5-72b"), h200, 8) == 4  # 270 GB / 4
    assert rollout_tp_for(model_shape("preset:qwen2.5-72b"), h200, 2) == 2  # no more than a node's GPUs
    assert rollout_tp_for(model_shape("preset:qwen2.5-7b"), h200, 8, configured=4) == 4


def test_users_rollout_tp_counts_only_a_users_value_that_divides_the_world():
    from rlforge.config import load_config
    from rlforge.tune.workload import users_rollout_tp

    key = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    assert users_rollout_tp(load_config([]), 8) == 1  # verl's default of 2 is not the user's
    assert users_rollout_tp(load_config([f"{key}=4"]), 8) == 4
    assert users_rollout_tp(load_config([f"{key}=3"]), 8) == 1

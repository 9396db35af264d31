"""Point 4 of issue 39: the tuner writes only the lever keys, never what changes the learning."""

import re

from rlforge.config import load_config, schema
from rlforge.config.auto_keys import LEVER_KEYS
from rlforge.config.common import get_key
from rlforge.config.root import RLForgeConfig
from rlforge.tune.apply import apply_levers
from rlforge.tune.levers import KEYS, Levers, written_keys

LEARNING = re.compile(r"(batch_size|\.n$|rollout_n|\.lr|lr_|loss|kl|clip|epochs|entropy|temperature|top_[kp]|"
                      r"adv_estimator|gamma|lam$|seed|weight_decay|optim\.)")


def _leaves() -> list[str]:
    return [k for k in schema.all_keys(RLForgeConfig) if schema.kind_of(schema.lookup(RLForgeConfig, k)) != "node"]


def test_every_written_key_accepts_auto_and_exists():
    assert written_keys() <= set(LEVER_KEYS)
    for key in LEVER_KEYS:
        assert schema.lookup(RLForgeConfig, key) is not None, key


def test_no_key_that_changes_the_learning_is_a_lever():
    learning = {k for k in _leaves() if LEARNING.search(k)}
    assert len(learning) > 50  # the walk found the schema's learning keys
    assert not learning & set(LEVER_KEYS), learning & set(LEVER_KEYS)


def test_applying_any_setting_changes_only_lever_keys():
    cfg = load_config([])
    before = {k: get_key(cfg, k) for k in _leaves()}
    lev = Levers(dynamic_bsz=True, token_budget=4096, log_prob_budget=8192, remove_padding=True, liger=True,
                 checkpointing=False, activation_offload=True, param_offload=True, optimizer_offload=True,
                 ref_param_offload=True, reshard=False, forward_prefetch=True, gpu_memory_utilization=0.8,
                 max_num_seqs=7, max_num_batched_tokens=99, free_cache_engine=False, fused_kernels=False)
    written = apply_levers(cfg, lev)
    changed = {k for k in _leaves() if get_key(cfg, k) != before[k]}
    assert changed == set(written) and changed <= set(LEVER_KEYS)
    assert len(changed) == sum(len(v) for v in KEYS.values())  # every lever key differed from verl's default


def test_keys_the_user_set_are_never_written():
    cfg = load_config(["actor_rollout_ref.model.enable_gradient_checkpointing=true",
                       "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4096"])
    written = apply_levers(cfg, Levers(checkpointing=False, token_budget=65536, log_prob_budget=65536))
    assert "actor_rollout_ref.model.enable_gradient_checkpointing" not in written
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 4096
    assert cfg.actor_rollout_ref.ref.log_prob_max_token_len_per_gpu == 4096  # follows the user's key
    assert "critic.model.enable_gradient_checkpointing" in written

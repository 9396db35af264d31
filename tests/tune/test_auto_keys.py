"""Set versus unset (issue 39): ``auto`` values, the user's keys from the command line and files,
interpolations followed, and one error for ``auto`` on a key without a tuner."""

import pytest

from rlforge.config import load_config
from rlforge.config.auto_keys import LEVER_KEYS, auto_keys
from rlforge.config.user_keys import user_set
from rlforge.errors import ConfigError
from rlforge.tune.apply import fixed_levers
from rlforge.tune.unset import free_keys, is_users

BUDGET = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
REF_BUDGET = "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"


def test_auto_on_a_lever_is_the_schema_default_and_not_the_users():
    cfg = load_config([f"{BUDGET}=auto", "actor_rollout_ref.model.use_liger=true"])
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 16384
    assert auto_keys(cfg) == {BUDGET}
    assert not user_set(cfg, BUDGET) and user_set(cfg, "actor_rollout_ref.model.use_liger")
    assert fixed_levers(cfg) == {"liger": True}


def test_auto_drops_an_earlier_value_and_a_later_value_wins(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("actor_rollout_ref:\n  actor:\n    ppo_max_token_len_per_gpu: 4096\n")
    cfg = load_config([f"{BUDGET}=auto"], config_file=str(f))
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 16384 and not is_users(cfg, BUDGET)
    cfg = load_config([f"{BUDGET}=auto", f"{BUDGET}=8192"])
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 8192 and is_users(cfg, BUDGET)
    assert auto_keys(cfg) == frozenset()


def test_auto_in_a_yaml_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("actor_rollout_ref:\n  rollout:\n    gpu_memory_utilization: auto\n")
    cfg = load_config([], config_file=str(f))
    assert auto_keys(cfg) == {"actor_rollout_ref.rollout.gpu_memory_utilization"}
    assert cfg.actor_rollout_ref.rollout.gpu_memory_utilization == 0.5


def test_a_file_value_is_the_users(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("actor_rollout_ref:\n  model:\n    enable_gradient_checkpointing: false\n")
    cfg = load_config([], config_file=str(f))
    assert fixed_levers(cfg) == {"checkpointing": False}


def test_interpolated_keys_follow_the_users_key():
    cfg = load_config([f"{BUDGET}=8192"])
    assert is_users(cfg, REF_BUDGET)  # ${actor...ppo_max_token_len_per_gpu}
    assert is_users(cfg, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu")
    cfg = load_config(["critic.ppo_max_token_len_per_gpu=4096"])
    assert is_users(cfg, "critic.forward_max_token_len_per_gpu")  # ${.ppo_max_token_len_per_gpu}
    assert not is_users(cfg, REF_BUDGET)


def test_unset_levers_are_free_and_a_config_built_in_code_is_all_users():
    cfg = load_config([])
    assert free_keys(cfg, LEVER_KEYS) == set(LEVER_KEYS)
    from rlforge.config.root import RLForgeConfig

    assert free_keys(RLForgeConfig(), LEVER_KEYS) == set()


@pytest.mark.parametrize("override", ["data.train_batch_size=auto", "actor_rollout_ref.actor.optim.lr=auto"])
def test_auto_on_another_key_is_one_error_naming_the_keys_that_take_it(override):
    with pytest.raises(ConfigError) as e:
        load_config([override])
    msg = str(e.value)
    assert override.split("=")[0] in msg and BUDGET in msg and "\n" not in msg

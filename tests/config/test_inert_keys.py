"""Keys that only matter with another key on: set without it, each warns once by name (issue 38: no silent key),
and with it on, none warns."""

from __future__ import annotations

import pytest

from rlforge.config import load_config
from rlforge.config.later_work import later_work_warnings

GRPO = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4"]


@pytest.mark.parametrize(("overrides", "line"), [
    (["algorithm.gamma=0.5"], "algorithm.gamma=0.5 is read only by algorithm.adv_estimator=gae / reinforce_plus_plus "
                              "(this run: grpo); ignored"),
    (["algorithm.lam=0.3"], "algorithm.lam=0.3 is read only by algorithm.adv_estimator=gae (this run: grpo); ignored"),
    (["actor_rollout_ref.actor.kl_loss_coef=0.5"],
     "actor_rollout_ref.actor.kl_loss_coef=0.5 only applies with actor_rollout_ref.actor.use_kl_loss=true; ignored"),
    (["algorithm.kl_ctrl.kl_coef=0.3", "algorithm.kl_penalty=mse"],
     "algorithm.kl_ctrl.kl_coef=0.3, algorithm.kl_penalty=mse: only applies with algorithm.use_kl_in_reward=true; "
     "ignored"),
])
def test_a_key_whose_switch_is_off_warns(overrides, line):
    assert line in later_work_warnings(load_config([*GRPO, *overrides]))


@pytest.mark.parametrize("overrides", [
    ["algorithm.adv_estimator=gae", "algorithm.gamma=0.5", "algorithm.lam=0.3"],
    ["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.gamma=0.5"],
    ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.5"],
    ["algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.3"],
])
def test_the_same_keys_with_their_switch_on_do_not(overrides):
    cfg = load_config([*GRPO, *overrides])
    keys = ("algorithm.gamma", "algorithm.lam", "kl_loss_coef", "algorithm.kl_ctrl")
    assert not [w for w in later_work_warnings(cfg) if any(k in w for k in keys)]

"""AdamW's betas and the cosine schedule's floor and cycles: one line each where torch would raise or the lr
would climb past its peak (verl asserts 0 <= min_lr_ratio <= 1)."""

from __future__ import annotations

import pytest

from rlforge.config import load_config, validate_config
from rlforge.config.sft import load_sft_config, validate_sft_config
from rlforge.errors import ConfigError

OPT = "actor_rollout_ref.actor.optim"


@pytest.mark.parametrize(("override", "message"), [
    (f"{OPT}.betas=[0.9]", "betas=[0.9]: must be two numbers in [0, 1)"),
    (f"{OPT}.betas=[1.5,0.9]", "betas=[1.5, 0.9]: must be two numbers"),
    (f"{OPT}.betas=[0.9,0.99,0.5]", "betas=[0.9, 0.99, 0.5]: must be two numbers"),
    (f"{OPT}.min_lr_ratio=2", "min_lr_ratio=2.0: must be in [0, 1]"),
    (f"{OPT}.num_cycles=-1", "num_cycles=-1.0: must be >= 0"),
    ("critic.optim.betas=[0.9]", "critic.optim.betas=[0.9]: must be two"),
])
def test_ppo_optim_ranges(override, message):
    with pytest.raises(ConfigError, match=f"^.*{message.replace('[', '[[]').replace('(', '[(]').replace(')', '[)]')}"):
        validate_config(load_config([override]))


@pytest.mark.parametrize("override", ["optim.betas=[0.9]", "optim.min_lr_ratio=5", "optim.num_cycles=-1"])
def test_sft_optim_ranges(override):
    with pytest.raises(ConfigError, match="^optim\\."):
        validate_sft_config(load_sft_config([override]))


def test_defaults_pass():
    validate_config(load_config([]))
    validate_sft_config(load_sft_config([]))

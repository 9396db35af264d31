"""One key under two names in one layer (rlforge/config/alias_conflicts.py)."""

from __future__ import annotations

import pytest

from rlforge.config import load_config
from rlforge.config.sft import load_sft_config
from rlforge.errors import ConfigError


def _yaml(tmp_path, text: str) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return str(path)


def test_verl_alias_beside_its_key_with_another_value_is_one_error(tmp_path):
    # a dumped verl config with grad_clip edited and optim.clip_grad left at verl's 1.0: the old loader
    # silently kept 1.0 (the alias), undoing the edit
    f = _yaml(tmp_path, "actor_rollout_ref:\n  actor:\n    grad_clip: 3.0\n    optim:\n      clip_grad: 1.0\n")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.grad_clip=3\.0 and "
                                          r"actor_rollout_ref\.actor\.optim\.clip_grad=1\.0 \(in config file"):
        load_config([], config_file=f)


def test_verl_alias_beside_its_key_with_the_same_value_loads(tmp_path):
    f = _yaml(tmp_path, "actor_rollout_ref:\n  actor:\n    grad_clip: 2.0\n    optim:\n      clip_grad: 2\n")
    assert load_config([], config_file=f).actor_rollout_ref.actor.grad_clip == 2.0


def test_in_one_override_too():
    with pytest.raises(ConfigError, match="two names of one key"):
        load_config(["actor_rollout_ref.actor={grad_clip: 3.0, optim: {clip_grad: 2.0}}"])


def test_across_layers_the_later_wins():
    cfg = load_config(["actor_rollout_ref.actor.grad_clip=3.0", "actor_rollout_ref.actor.optim.clip_grad=2.0"])
    assert cfg.actor_rollout_ref.actor.grad_clip == 2.0
    cfg = load_config(["actor_rollout_ref.actor.optim.clip_grad=2.0", "actor_rollout_ref.actor.grad_clip=3.0"])
    assert cfg.actor_rollout_ref.actor.grad_clip == 3.0


def test_sft_alias_conflict_is_one_error(tmp_path):
    f = _yaml(tmp_path, "model:\n  strategy: fsdp2\nengine:\n  strategy: fsdp\n")
    with pytest.raises(ConfigError, match=r"model\.strategy='fsdp2' and engine\.strategy='fsdp'"):
        load_sft_config([], config_file=f)


@pytest.mark.parametrize("order", ["old_first", "new_first"])
def test_older_spelling_wins_whatever_the_order(tmp_path, order):
    # verl reads warmup_style over lr_scheduler_type (its __post_init__); before, the YAML's order decided
    lines = ["      lr_scheduler_type: cosine\n", "      warmup_style: constant\n"]
    if order == "old_first":
        lines.reverse()
    f = _yaml(tmp_path, "actor_rollout_ref:\n  actor:\n    optim:\n" + "".join(lines))
    assert load_config([], config_file=f).actor_rollout_ref.actor.optim.lr_scheduler_type == "constant"

"""Values found by trying to break the config (world size, gen_batch_size, check-config verdicts)."""

from __future__ import annotations

import pytest

from rlforge.config import load_config, validate_config
from rlforge.config.check import WARNED, check_config
from rlforge.errors import ConfigError


@pytest.mark.parametrize("override, key", [
    ("trainer.nnodes=0", "trainer.nnodes=0"), ("trainer.n_gpus_per_node=-2", "trainer.n_gpus_per_node=-2"),
    ("data.gen_batch_size=0", "data.gen_batch_size=0"), ("data.gen_batch_size=-3", "data.gen_batch_size=-3"),
])
def test_non_positive_counts_are_refused(override, key):
    cfg = load_config(["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8", override])
    with pytest.raises(ConfigError, match=f"{key}: must be"):
        validate_config(cfg)


def test_zero_nodes_under_a_launcher_is_an_error_not_a_traceback(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # was: ZeroDivisionError in run_world
    cfg = load_config(["trainer.nnodes=0"])
    with pytest.raises(ConfigError, match="trainer.nnodes=0"):
        validate_config(cfg)


def test_check_config_names_a_top_level_key_in_its_own_warning():
    report = check_config(["model_engine=bogus"])  # was: "model_engine: takes effect", warning under (other)
    verdict = next(k for k in report.keys if k.key == "model_engine")
    assert verdict.verdict == WARNED and "model_engine=bogus" in verdict.detail

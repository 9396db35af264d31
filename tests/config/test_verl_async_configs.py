"""verl's fully-async and one-step-off trainer configs (their own Hydra files over ``ppo_trainer``): read through
``--config-path/--config-name`` they are accepted, and each key of theirs that rlforge has no counterpart for
warns by name when set away from the file's value (rlforge trains colocated; ``config/verl_keys.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlforge.config.check import check_config

FOLDER = Path(__file__).parent / "verl_configs"
ASYNC = "fully_async_ppo_trainer"


def _leaves(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_leaves(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


@pytest.mark.parametrize("name", [ASYNC, "one_step_off_ppo_trainer"])
def test_verls_async_trainer_configs_are_accepted(name):
    report = check_config([], config_path=str(FOLDER), config_name=name)
    assert report.keys  # the file's keys were read (none refused: check_config raises on a refusal)


NOT_OURS = [k for k in _leaves(yaml.safe_load((FOLDER / f"{ASYNC}.yaml").read_text()))
            if k.startswith(("async_training.", "rollout.")) and k not in (
                "async_training.partial_rollout", "async_training.staleness_threshold")]  # rlforge's own keys


def test_the_fixture_lists_the_split_trainers_keys():
    assert {"async_training.trigger_parameter_sync_step", "async_training.require_batches", "rollout.nnodes",
            "rollout.total_rollout_steps", "async_training.checkpoint_engine.enable"} <= set(NOT_OURS)


@pytest.mark.parametrize("key", NOT_OURS)
def test_a_split_trainer_key_set_away_from_its_value_warns_by_name(key):
    value = yaml.safe_load((FOLDER / f"{ASYNC}.yaml").read_text())
    for part in key.split("."):
        value = value[part]
    other = (not value) if isinstance(value, bool) else (value + 3 if isinstance(value, int) else "x")
    report = check_config([f"{key}={str(other).lower() if isinstance(other, bool) else other}"],
                          config_path=str(FOLDER), config_name=ASYNC)
    verdict = next(v for v in report.keys if v.key == key)
    assert verdict.verdict == "warned" and f"{key}=" in verdict.line(), verdict.line()

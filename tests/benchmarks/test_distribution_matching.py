"""benchmarks/distribution_matching.py: its runs save the actor/state.pt checkpoints it reads back."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from rlforge.config import load_config

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "distribution_matching.py"
_spec = importlib.util.spec_from_file_location("distribution_matching", _PATH)
dm = importlib.util.module_from_spec(_spec)
sys.modules["distribution_matching"] = dm
_spec.loader.exec_module(dm)


@pytest.mark.parametrize("algorithm", ["flowrl", "grpo"])
def test_runs_save_full_checkpoints_under_the_default_job(tmp_path, algorithm) -> None:
    # `rlforge train` starts from the default job, whose save is [hf_model] only (no actor/state.pt);
    # policy_probs reads global_step_N/actor/state.pt, so the benchmark must ask for the model.
    args = dm.parse_args([])
    cfg = load_config(dm.overrides(args, algorithm, tmp_path), job="default")
    assert "model" in list(cfg.actor_rollout_ref.actor.checkpoint.save_contents)
    assert cfg.trainer.save_freq == args.eval_every

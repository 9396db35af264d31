"""verl's experimental split trainers' scripts (fully-async, one-step-off: ``tests/fixtures/verl_split_examples.json``,
extracted by ``extract_verl_examples.py --split`` from verl b178a3c), run through ``rlforge check-config`` as
``python -m rlforge.trainer.fully_async_main`` / ``one_step_off_main`` would read them: each is accepted, or
refused in one line for a reason that is the script's own (listed here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from verl_examples_harness import run_entry

from rlforge.config import load_config, validate_config
from rlforge.errors import ConfigError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "verl_split_examples.json"
REFUSED = {
    # the script names a config file that verl's own tree does not have at this commit
    "verl/experimental/fully_async_policy/shell/dapo_30b_a3b_base_math_fsdp.sh":
        "--config-name fully_async_dapo_trainer.yaml: no file",
    # 128 prompts x n=16 = 2048 samples on 12 training ranks: no equal share per rank
    "verl/experimental/fully_async_policy/shell/dapo_7b_math_fsdp2_4_12.sh":
        "data.train_batch_size=128 is not divisible by the 12 ranks",
    # an Ascend script whose token budget is below one 32k-token sequence
    "verl/experimental/one_step_off_policy/shell/grpo_qwen3_8b_gsm8k_fsdp2_8_8_npu.sh":
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=4352 is smaller than the longest possible sequence",
}
SCRIPTS = json.loads(FIXTURE.read_text())["scripts"]


def test_the_fixture_holds_both_trainers_scripts():
    assert len(SCRIPTS) == 21
    assert sum("fully_async_policy" in s for s in SCRIPTS) == 12 and set(REFUSED) <= set(SCRIPTS)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_each_split_trainer_script_is_accepted_or_refused_in_one_line(script, tmp_path):
    outcome = run_entry(SCRIPTS[script], set(), set(), tmp_path)
    if script in REFUSED:
        assert outcome.error is not None and outcome.error.startswith(REFUSED[script]), outcome.error
        assert "\n" not in outcome.error
    else:
        assert outcome.error is None, outcome.error


def test_a_zero_train_batch_takes_the_fully_async_trainers_step_and_partial_rollout_needs_one_process(monkeypatch):
    """verl's fully-async ``data.train_batch_size=0``: ``require_batches x ppo_mini_batch_size`` prompts per step;
    its ``partial_rollout=true`` on 4 processes trains synchronously, said in one line each."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = load_config(["data.train_batch_size=0", "async_training.require_batches=3",
                       "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.n=4",
                       "algorithm.adv_estimator=grpo", "async_training.partial_rollout=true",
                       "trainer.n_gpus_per_node=4", "trainer.device=cpu"], job=None)
    assert cfg.data.train_batch_size == 24 and cfg.async_training.partial_rollout is False
    warnings = validate_config(cfg)
    assert ("data.train_batch_size=0 (verl's fully-async trainer: the rollouter streams batches) trains "
            "async_training.require_batches x actor_rollout_ref.actor.ppo_mini_batch_size = 3 x 8 = 24 prompts per "
            "step here (rlforge trains colocated, one batch per step)") in warnings
    assert not [w for w in warnings if w.startswith("async_training.require_batches=")]  # it sized the batch
    assert any(w.startswith("async_training.partial_rollout=true (verl's fully-async trainer): rlforge's partial "
                            "rollout is off for this run, because it runs in one process in this build, and this "
                            "run has 4") for w in warnings)


@pytest.mark.parametrize("value", ["abc", "[1,2]", "2.5", "0", "-1", "true"])
def test_a_require_batches_that_is_no_whole_number_above_zero_is_one_error(value):
    """Before: a traceback (abc, a list), 2.5 truncated to 2, 0 read as 1, -1 blamed on a computed batch of -2."""
    with pytest.raises(ConfigError, match=r"^async_training\.require_batches=.*: must be a whole number >= 1"):
        load_config(["data.train_batch_size=0", f"async_training.require_batches={value}",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=2"])


def test_without_verls_split_keys_the_same_values_stay_errors(monkeypatch):
    from rlforge.errors import ConfigError

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ConfigError, match=r"data.train_batch_size=0"):
        validate_config(load_config(["data.train_batch_size=0"]))
    with pytest.raises(ConfigError, match=r"partial_rollout=true runs in one process"):
        validate_config(load_config(["async_training.partial_rollout=true", "trainer.n_gpus_per_node=2",
                                     "trainer.device=cpu"]))


def test_the_split_trainers_entry_points_default_to_their_configs(capsys):
    from rlforge.trainer import fully_async_main, one_step_off_main

    assert fully_async_main.main(["--print-config"]) == 0
    out = capsys.readouterr().out
    assert "partial_rollout: true" in out and "staleness_threshold: 0.1" in out  # verl's fully-async values
    assert one_step_off_main.main(["--print-config"]) == 0
    assert "bypass_mode: true" in capsys.readouterr().out
    assert fully_async_main.main(["--config-name", "ppo_trainer", "--print-config"]) == 0  # a name given wins
    assert "partial_rollout: false" in capsys.readouterr().out


@pytest.mark.parametrize("blocker, reason", [
    ("actor_rollout_ref.rollout.name=hf",
     "needs actor_rollout_ref.rollout.name=native (got hf): only the native engine continues a stopped response"),
    ("actor_rollout_ref.rollout.multi_turn.enable=true",
     "does not run with actor_rollout_ref.rollout.multi_turn.enable"),
    ("algorithm.filter_groups.enable=true",
     "does not run with algorithm.filter_groups.enable (dynamic sampling)"),
])
def test_partial_rollout_is_refused_and_turned_off_for_the_same_reason(blocker, reason, monkeypatch):
    """One list of what stops partial rollout: rlforge's own keys raise it, verl's split-trainer keys warn it."""
    from rlforge.errors import ConfigError

    monkeypatch.delenv("WORLD_SIZE", raising=False)
    base = ["async_training.partial_rollout=true", "trainer.device=cpu", "actor_rollout_ref.rollout.n=2", blocker]
    with pytest.raises(ConfigError) as err:
        validate_config(load_config(base))
    assert str(err.value) == f"async_training.partial_rollout=true {reason}"
    cfg = load_config([*base, "async_training.require_batches=1"], job=None)
    assert cfg.async_training.partial_rollout is False
    assert (f"async_training.partial_rollout=true (verl's fully-async trainer): rlforge's partial rollout is off for "
            f"this run, because it {reason}; each step generates and trains synchronously") in validate_config(cfg)

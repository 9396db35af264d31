"""One run per run folder: a run whose config differs from the one saved in its folder on the keys that
make it another run stops with one error naming them (saved -> now) and the fix; resume_mode=disable starts
over in a fresh sub-folder, leaving the earlier run's files as they were; the same run resumes as before."""

from __future__ import annotations

import json

import pytest
import yaml

from rlforge.errors import ConfigError
from rlforge.trainer.run_folder import RUN_CONFIG, check_run_folder, record_config, saved_config

DEFAULT_JOB = {
    "actor_rollout_ref": {"model": {"path": "HuggingFaceTB/SmolLM2-135M-Instruct", "override_config": {}},
                          "actor": {"optim": {"lr": 1e-6}}, "rollout": {"n": 5}},
    "data": {"train_files": "builtin:arithmetic", "train_batch_size": 16, "max_response_length": 256, "seed": 1},
    "algorithm": {"adv_estimator": "grpo"},
    "trainer": {"total_training_steps": 20, "resume_mode": "auto", "experiment_name": "default_job",
                "default_local_dir": "checkpoints/rlforge/default_job", "logger": ["console", "file"]},
}


def edited(tree: dict, **edits) -> str:
    """``tree`` as YAML with ``a__b=value`` edits applied."""
    tree = json.loads(json.dumps(tree))
    for key, value in edits.items():
        node = tree
        *head, last = key.split("__")
        for part in head:
            node = node[part]
        node[last] = value
    return yaml.safe_dump(tree)


@pytest.fixture
def default_job_folder(tmp_path):
    """A folder holding the default job's output: its config, metrics and a 20th-step save."""
    record_config(tmp_path, yaml.safe_dump(DEFAULT_JOB))
    (tmp_path / "metrics.jsonl").write_text('{"step": 20, "timing_s/step": 1.0}\n')
    (tmp_path / "global_step_20" / "actor").mkdir(parents=True)
    (tmp_path / "global_step_20" / "config.yaml").write_text(yaml.safe_dump(DEFAULT_JOB))
    return tmp_path


def _files(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_another_run_is_one_error_naming_each_differing_key_and_the_fix(default_job_folder):
    tiny = edited(DEFAULT_JOB, actor_rollout_ref__model__path="preset:tiny", data__train_batch_size=4,
                  actor_rollout_ref__rollout__n=2, trainer__total_training_steps=1)
    before = _files(default_job_folder)
    with pytest.raises(ConfigError) as e:
        check_run_folder(default_job_folder, tiny, "auto")
    msg = str(e.value)
    assert "\n" not in msg
    for part in (f"trainer.default_local_dir={default_job_folder}", str(default_job_folder / RUN_CONFIG),
                 "actor_rollout_ref.model.path: HuggingFaceTB/SmolLM2-135M-Instruct -> preset:tiny",
                 "data.train_batch_size: 16 -> 4", "actor_rollout_ref.rollout.n: 5 -> 2", "(saved -> now)",
                 "trainer.experiment_name=", "trainer.default_local_dir=", "trainer.resume_mode=disable"):
        assert part in msg, (part, msg)
    assert "total_training_steps" not in msg  # how long to train is not another run
    assert _files(default_job_folder) == before


def test_same_run_with_live_keys_changed_keeps_its_folder(default_job_folder):
    again = edited(DEFAULT_JOB, trainer__total_training_steps=40, actor_rollout_ref__actor__optim__lr=5e-6,
                   trainer__logger=["console"], trainer__resume_mode="resume_path",
                   trainer__default_local_dir="/elsewhere/moved")
    assert check_run_folder(default_job_folder, again, "auto") == default_job_folder
    assert check_run_folder(default_job_folder, again, "resume_path") == default_job_folder


def test_disable_starts_over_in_a_fresh_sub_folder_leaving_the_old_files(default_job_folder, capsys):
    before = _files(default_job_folder)
    other = edited(DEFAULT_JOB, actor_rollout_ref__model__path="preset:tiny")
    first = check_run_folder(default_job_folder, other, "disable")
    assert first == default_job_folder / "run-1" and first.is_dir() and not any(first.iterdir())
    assert f"starts over in {first}" in capsys.readouterr().out
    assert check_run_folder(default_job_folder, yaml.safe_dump(DEFAULT_JOB), "disable") == default_job_folder / "run-2"
    assert _files(default_job_folder) == before  # nothing of the earlier run was moved, renamed or rewritten


def test_disable_in_an_empty_folder_writes_there(tmp_path):
    (tmp_path / ".rlforge.lock").write_text("{}")  # this run's own lock
    (tmp_path / "notes.txt").write_text("not run output")
    assert check_run_folder(tmp_path, yaml.safe_dump(DEFAULT_JOB), "disable") == tmp_path
    assert check_run_folder(tmp_path / "new", yaml.safe_dump(DEFAULT_JOB), "auto") == tmp_path / "new"


def test_without_run_config_the_newest_checkpoint_config_is_compared(tmp_path):
    for step, path in ((2, "preset:tiny"), (10, "preset:other")):  # newest by number, not by name
        (tmp_path / f"global_step_{step}").mkdir()
        (tmp_path / f"global_step_{step}" / "config.yaml").write_text(
            edited(DEFAULT_JOB, actor_rollout_ref__model__path=path))
    assert saved_config(tmp_path, "auto") == tmp_path / "global_step_10" / "config.yaml"
    with pytest.raises(ConfigError, match="actor_rollout_ref.model.path: preset:other -> preset:tiny"):
        check_run_folder(tmp_path, edited(DEFAULT_JOB, actor_rollout_ref__model__path="preset:tiny"), "auto")


def test_auto_resume_compares_with_the_checkpoint_it_continues(tmp_path):
    record_config(tmp_path, edited(DEFAULT_JOB, data__seed=7))  # a later restart's record
    ckpt = tmp_path / "global_step_3"
    ckpt.mkdir()
    (ckpt / "trainer_state.pt").write_bytes(b"")
    (ckpt / "config.yaml").write_text(yaml.safe_dump(DEFAULT_JOB))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("3")
    assert saved_config(tmp_path, "auto") == ckpt / "config.yaml"
    with pytest.raises(ConfigError, match=r"global_step_3.*data.seed: 1 -> 2"):
        check_run_folder(tmp_path, edited(DEFAULT_JOB, data__seed=2), "auto")
    (ckpt / "config.yaml").unlink()  # an older checkpoint: left to the resume's weight-shape checks
    assert check_run_folder(tmp_path, edited(DEFAULT_JOB, data__seed=2), "auto") == tmp_path


def test_output_of_an_unknown_run_is_one_error(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / "trace").mkdir()
    with pytest.raises(ConfigError) as e:
        check_run_folder(tmp_path, yaml.safe_dump(DEFAULT_JOB), "auto")
    for part in ("metrics.jsonl, trace", RUN_CONFIG, "trainer.experiment_name=", "trainer.resume_mode=disable"):
        assert part in str(e.value), (part, str(e.value))


@pytest.mark.parametrize("estimator, named", [("grpo", False), ("gae", True)])
def test_an_unused_critic_is_not_named(default_job_folder, estimator, named):
    """GRPO trains no critic: its critic.model.* keys follow the actor's model path by interpolation and
    are left out of the error; with GAE (a critic) they are named."""
    saved = json.loads(json.dumps(DEFAULT_JOB))
    saved["critic"] = {"enable": None, "model": {"path": "HuggingFaceTB/SmolLM2-135M-Instruct",
                                                 "tokenizer_path": "HuggingFaceTB/SmolLM2-135M-Instruct"}}
    saved["algorithm"]["adv_estimator"] = estimator
    record_config(default_job_folder, yaml.safe_dump(saved))
    (default_job_folder / "global_step_20" / "config.yaml").write_text(yaml.safe_dump(saved))
    now = edited(saved, actor_rollout_ref__model__path="preset:tiny", critic__model__path="preset:tiny",
                 critic__model__tokenizer_path="preset:tiny")
    with pytest.raises(ConfigError) as e:
        check_run_folder(default_job_folder, now, "auto")
    assert "actor_rollout_ref.model.path" in str(e.value)
    assert ("critic.model.tokenizer_path" in str(e.value)) is named


def test_interrupted_says_what_the_same_command_resumes(tmp_path):
    from rlforge.trainer.run_folder import TRACKER, interrupted_message

    msg = interrupted_message(tmp_path, 3, 5, ["model", "optimizer", "extra"])
    assert "nothing resumable was saved" in msg and "step 5 (trainer.save_freq=5)" in msg
    msg = interrupted_message(tmp_path, 3, 1, ["hf_model"])
    assert "nothing resumable" in msg and "actor_rollout_ref.actor.checkpoint.save_contents=['hf_model']" in msg
    assert "trainer.save_freq=-1 saves only at the last step" in interrupted_message(tmp_path, 3, -1, ["model"])
    (tmp_path / "global_step_2").mkdir()
    (tmp_path / "global_step_2" / "trainer_state.pt").write_bytes(b"x")
    (tmp_path / TRACKER).write_text("2")
    msg = interrupted_message(tmp_path, 3, 2, ["model", "optimizer", "extra"])
    assert f"resumes from {tmp_path / 'global_step_2'} (step 2)" in msg and "\n" not in msg

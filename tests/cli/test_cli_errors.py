"""The ``rlforge`` command line: user mistakes exit with status 2 and one message naming the key,
file or row, never a traceback.  The entry points run as a user runs them (a subprocess: ``cli``);
the other mistakes go through the same ``main`` in this process (``in_process``: no interpreter
start and imports, ~7 s of CPU each)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import user_error

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
TINY = ["actor_rollout_ref.model.path=preset:tiny", "trainer.device=cpu"]
# one prompt per step and one response per prompt: the smallest job that reaches data loading
ONE = ["data.val_files=null", "data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.n=2",
       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2"]


def cli(*args: str, module: str = "rlforge.cli", cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=ENV,
                          timeout=120, cwd=cwd)


def in_process(capfd, *args: str, module: str = "rlforge.cli") -> subprocess.CompletedProcess:
    """``module``'s ``main(args)`` in this process: its status and what it printed (the same fields
    as :func:`cli`'s; an exception escaping ``main``, which a user would see as a traceback, fails the test)."""
    main = importlib.import_module(module).main
    capfd.readouterr()
    status = main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(list(args), status, out, err)


@pytest.mark.e2e
def test_unknown_key_suggests_closest():
    user_error(cli("train", "trainer.total_training_step=2"),
               "'trainer.total_training_step'", "'trainer.total_training_steps'")


def test_wrong_type_names_key_and_value(capfd):
    user_error(in_process(capfd, "train", "trainer.total_training_steps=abc"), "trainer.total_training_steps", "abc",
               "int")


def test_batch_size_that_does_not_divide(capfd):
    user_error(in_process(capfd, "train", "data.train_batch_size=5", "actor_rollout_ref.actor.ppo_mini_batch_size=2"),
               "data.train_batch_size=5", "actor_rollout_ref.actor.ppo_mini_batch_size=2")


@pytest.mark.e2e
def test_hub_id_not_cached_and_hub_unreachable(tmp_path):
    """A Hub id while the Hub cannot be reached (a closed local port) and the cache is empty: one line naming
    the cache and how to get the model.  ``rlforge`` leaves HF_HUB_OFFLINE unset, so an online user downloads."""
    env = {k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT="http://127.0.0.1:9", HF_HUB_CACHE=str(tmp_path / "hf"), HF_HUB_ETAG_TIMEOUT="1")
    res = subprocess.run([sys.executable, "-m", "rlforge.cli", "train", "actor_rollout_ref.model.path=org/absent",
                          "trainer.device=cpu", *ONE, f"trainer.default_local_dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, env=env, timeout=120)
    user_error(res, "actor_rollout_ref.model.path=org/absent: the model is not in the local Hugging Face cache",
               str(tmp_path / "hf"), "the Hugging Face Hub cannot be reached", "hf download org/absent")


@pytest.mark.e2e
def test_missing_data_file(capfd):
    user_error(in_process(capfd, "train", *TINY, *ONE, "data.train_files=/nonexistent.parquet"), "/nonexistent.parquet")


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _row(content: str) -> dict:
    return {"prompt": [{"role": "user", "content": content}], "data_source": "x",
            "reward_model": {"ground_truth": "1"}}


@pytest.mark.e2e
def test_data_rows(tmp_path, capfd):
    bad = _write_jsonl(tmp_path / "bad.jsonl", [_row("hi"), _row("ho"), {"data_source": "x"}])
    user_error(in_process(capfd, "train", *TINY, *ONE, f"data.train_files={bad}"), bad, "row 2", "prompt")


@pytest.mark.e2e
def test_prompt_longer_than_max_prompt_length(tmp_path, capfd):
    long = _write_jsonl(tmp_path / "long.jsonl", [_row("short"), _row("a rather long prompt " * 10)])
    user_error(in_process(capfd, "train", *TINY, *ONE, f"data.train_files={long}", "data.max_prompt_length=40",
                          "data.truncation=error"), long, "row 1", "data.max_prompt_length=40")


@pytest.mark.e2e
def test_model_path_missing(tmp_path, capfd):
    missing = str(tmp_path / "no_model")
    user_error(in_process(capfd, "train", *ONE, f"actor_rollout_ref.model.path={missing}"),
               "actor_rollout_ref.model.path", missing)


@pytest.mark.e2e
def test_custom_reward_file_missing(tmp_path, capfd):
    missing = str(tmp_path / "nope.py")
    user_error(in_process(capfd, "train", *TINY, *ONE, f"custom_reward_function.path={missing}"),
               "custom_reward_function.path", missing)


@pytest.mark.e2e
def test_custom_reward_function_raises(tmp_path):
    fn = tmp_path / "reward.py"
    fn.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    raise ZeroDivisionError('boom in user code')\n")
    res = cli("train", *TINY, *ONE, "data.max_response_length=2", "trainer.total_training_steps=1",
              "trainer.logger=[file]", f"trainer.default_local_dir={tmp_path / 'run'}",
              f"custom_reward_function.path={fn}")
    user_error(res, "sample 0", "rlforge/arithmetic", "boom in user code")


@pytest.mark.e2e
def test_print_config_is_the_default_job():
    res = cli("train", "--print-config")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert "adv_estimator: grpo" in res.stdout
    assert "train_files: builtin:arithmetic" in res.stdout


@pytest.mark.e2e
def test_main_ppo_print_config_starts_from_verl_defaults():
    res = cli("--print-config", module="rlforge.trainer.main_ppo")
    assert "Traceback" not in res.stderr
    assert res.returncode == 0, res.stderr
    assert "adv_estimator: gae" in res.stdout
    assert "train_batch_size: 1024" in res.stdout


def test_main_ppo_takes_verl_overrides(capfd):
    res = in_process(capfd, "--print-config", "critic.model.path=preset:tiny", "data.train_batch_size=2048",
                     module="rlforge.trainer.main_ppo")
    assert res.returncode == 0, res.stderr
    assert "adv_estimator: gae" in res.stdout
    assert "train_batch_size: 2048" in res.stdout


GSM8K = Path("/work/shared/data/gsm8k")


@pytest.mark.e2e
@pytest.mark.skipif(not (GSM8K / "train.jsonl").is_file(), reason="GSM8K source files not present")
def test_data_gsm8k_writes_both_splits(tmp_path):
    out = tmp_path / "out"
    res = cli("data", "gsm8k", "--src", str(GSM8K), "--out", str(out))
    assert res.returncode == 0, res.stderr
    import pyarrow.parquet as pq

    for split in ("train", "test"):
        n_src = sum(1 for line in (GSM8K / f"{split}.jsonl").read_text().splitlines() if line.strip())
        table = pq.read_table(out / f"{split}.parquet")
        assert table.num_rows == n_src
        assert f"wrote {n_src} rows to {out / (split + '.parquet')}" in res.stdout
        assert {"prompt", "data_source", "reward_model"} <= set(table.column_names)


def test_data_gsm8k_missing_src(tmp_path, capfd):
    missing = str(tmp_path / "nowhere")
    user_error(in_process(capfd, "data", "gsm8k", "--src", missing, "--out", str(tmp_path / "out")), missing)


def test_data_gsm8k_without_src_needs_datasets(tmp_path, capfd, monkeypatch):
    """No --src and no `datasets` installed: one line naming the install and --src."""
    monkeypatch.setitem(sys.modules, "datasets", None)  # importlib's find_spec -> None: not installed
    user_error(in_process(capfd, "data", "gsm8k", "--out", str(tmp_path / "out")), "pip install datasets", "--src")


def test_data_gsm8k_without_src_offline(tmp_path, capfd, monkeypatch):
    """No --src, offline (datasets raises ConnectionError, as datasets 5 does with HF_HUB_OFFLINE=1 and no cache):
    one line saying so and naming --src."""
    import importlib.machinery
    import types

    def load_dataset(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (OfflineModeIsEnabled)")

    fake = types.ModuleType("datasets")
    fake.__spec__ = importlib.machinery.ModuleSpec("datasets", None)
    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    user_error(in_process(capfd, "data", "gsm8k", "--out", str(tmp_path / "out")), "offline", "--src DIR")
    assert not (tmp_path / "out").exists()


def test_no_progress_bars_when_output_is_not_a_terminal(monkeypatch):
    """tqdm reads TQDM_DISABLE when a bar is made, also for bars that libraries draw directly (transformers'
    GGUF conversion): set for a file or pipe, left alone on a terminal or when the user set it."""
    import io

    from rlforge import cli

    for tty, preset, expected in ((False, None, "1"), (True, None, None), (False, "0", "0")):
        if preset is None:
            monkeypatch.delenv("TQDM_DISABLE", raising=False)
        else:
            monkeypatch.setenv("TQDM_DISABLE", preset)
        stream = io.StringIO()
        stream.isatty = lambda tty=tty: tty  # type: ignore[method-assign]
        monkeypatch.setattr(cli.sys, "stderr", stream)
        cli._library_environment()
        import os

        assert os.environ.get("TQDM_DISABLE") == expected, (tty, preset)


@pytest.mark.parametrize("command", ["check-config", "tune", "sft"])
def test_an_unknown_flag_names_its_own_command(command, capsys):
    from rlforge.cli import main

    assert main([command, "--bogus-flag"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"rlforge {command} takes" in err and "rlforge train" not in err, err


def test_an_unknown_sft_key_points_to_rlforge_sft(capsys):
    from rlforge.cli import main

    assert main(["sft", "zzz.qqq=1"]) == 2
    assert "see `rlforge sft --print-config`" in capsys.readouterr().err

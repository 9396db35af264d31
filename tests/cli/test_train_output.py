"""What ``rlforge train`` prints, as a user sees it in a log file, and verl's article-style
overrides (``--a.b=value``, ``--a.b value``) on its command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import user_error

from rlforge.cli import main
from rlforge.trainer import main_ppo

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
# the smallest CPU job: one step of 1 prompt x 2 responses of 4 tokens, no validation
TINY_RUN = ["actor_rollout_ref.model.path=preset:tiny", "data.train_files=builtin:arithmetic",
            "data.val_files=null", "trainer.total_training_steps=1", "trainer.device=cpu",
            "data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.n=2",
            "data.max_response_length=4", "data.builtin.train_size=8"]
if os.environ.get("RLFORGE_TEST_TOKENIZER"):  # offline machines without the default model's package
    TINY_RUN.append(f"actor_rollout_ref.model.tokenizer_path={os.environ['RLFORGE_TEST_TOKENIZER']}")


@pytest.mark.e2e
def test_log_has_start_line_summary_and_no_carriage_returns(tmp_path):
    """stdout and stderr into one pipe: no progress-bar frames, one start line first, the summary last."""
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "rlforge.cli", "train", *TINY_RUN, f"trainer.default_local_dir={out}",
                          "trainer.logger=[console,file]"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=ENV, timeout=300)
    text = res.stdout.decode()
    assert res.returncode == 0, text
    assert "\r" not in text, text
    lines = [line for line in text.splitlines() if not line.startswith("rlforge: warning: ")]
    start = lines[0]
    for part in ("rlforge train: start", "model preset:tiny", "task builtin:arithmetic", "1 step",
                 "device cpu", f"output {out}"):
        assert part in start, (part, start)
    assert sum("rlforge train: start" in line for line in lines) == 1
    assert any(line.startswith("step 1 | ") for line in lines), text
    done, where = lines[-2:]
    assert done.startswith("rlforge train: done in ") and "at step 1" in done and "no validation" in done, text
    hf = out / "global_step_1" / "actor" / "huggingface"  # the default job saves the policy after its last step
    assert where == f"rlforge train: metrics {out / 'metrics.jsonl'} | model {hf} (Hugging Face folder)"


@pytest.mark.e2e
def test_article_style_overrides_run(tmp_path, capsys):
    """The verl tuning guide's form, with the quotes of "fsdp2" literally in argv (as a script passes them)."""
    rc = main(["train", "--actor_rollout_ref.actor.use_dynamic_bsz=True", '--actor_rollout_ref.actor.strategy="fsdp2"',
               *TINY_RUN, "--trainer.default_local_dir", str(tmp_path), "trainer.logger=[console]"])
    assert rc == 0
    assert "rlforge train: done in " in capsys.readouterr().out
    # the run's saved config holds the values, unquoted and typed (not the string 'True', not '"fsdp2"')
    saved = yaml.safe_load((tmp_path / "global_step_1" / "config.yaml").read_text())
    actor = saved["actor_rollout_ref"]["actor"]
    assert actor["use_dynamic_bsz"] is True and actor["strategy"] == "fsdp2"


def _printed_config(capsys, entry, *args: str) -> dict:
    assert entry([*args, "--print-config"]) == 0
    return yaml.safe_load(capsys.readouterr().out)


def test_article_style_values(capsys):
    """``--k=v`` and ``--k v`` mean ``k=v``: Python-style booleans, quoted strings, negative numbers;
    rlforge's own flags (``--job``, ``--config``, ``--print-config``) keep working beside them."""
    cfg = _printed_config(capsys, lambda a: main(["train", *a]), "--job", "none",
                          "--actor_rollout_ref.actor.use_dynamic_bsz=True", '--actor_rollout_ref.actor.strategy="fsdp2"',
                          "--trainer.test_freq", "-1", "--trainer.experiment_name", "'my run'",
                          "--trainer.val_before_train=False", "data.train_batch_size=512")
    actor, trainer = cfg["actor_rollout_ref"]["actor"], cfg["trainer"]
    assert actor["use_dynamic_bsz"] is True and actor["strategy"] == "fsdp2"
    assert trainer["test_freq"] == -1 and trainer["experiment_name"] == "my run"
    assert trainer["val_before_train"] is False and cfg["data"]["train_batch_size"] == 512


def test_verl_entry_takes_article_style(capsys, tmp_path):
    """``python -m rlforge.trainer.main_ppo`` shares the parser."""
    extra = tmp_path / "extra.yaml"
    extra.write_text("trainer:\n  total_training_steps: 3\n")
    cfg = _printed_config(capsys, main_ppo.main, "--config", str(extra), '--actor_rollout_ref.actor.strategy="fsdp2"',
                          "--data.max_response_length", "32")
    assert cfg["actor_rollout_ref"]["actor"]["strategy"] == "fsdp2"
    assert cfg["data"]["max_response_length"] == 32 and cfg["trainer"]["total_training_steps"] == 3


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlforge.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=120, cwd=Path(__file__).parent)


@pytest.mark.e2e
def test_flag_without_value_is_one_error_line():
    user_error(cli("train", "--trainer.total_training_steps"), "--trainer.total_training_steps=VALUE",
               "trainer.total_training_steps=VALUE")
    user_error(cli("train", "--actor_rollout_ref.actor.use_dynamic_bsz", "trainer.device=cpu"),
               "--actor_rollout_ref.actor.use_dynamic_bsz=VALUE")


@pytest.mark.e2e
def test_unknown_flag_is_one_error_line():
    line = user_error(cli("train", "--total_training_steps=2"), "'--total_training_steps=2'", "--key=value")
    assert "usage:" not in line

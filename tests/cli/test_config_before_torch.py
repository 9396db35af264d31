"""A config error comes back before torch loads (issue 43, item 2): ``rlforge train`` and
``python -m rlforge.trainer.main_ppo`` parse and validate the config, and ``--print-config``
prints it, without importing torch, transformers, tensordict, peft or numpy (seconds of start-up
on a busy 2-core machine).  Measured by counting imports in a fresh interpreter, not by timing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "tensordict", "peft", "numpy")
ENV = {**os.environ, "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)}
_CHILD = """
import json, sys
from {module} import main
status = main({argv!r})
print(json.dumps({{"status": status, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def run_main(module: str, *argv: str) -> tuple[int, list[str], str, str]:
    """``module``'s ``main(argv)`` in a fresh interpreter: (exit status, the heavy modules it
    imported, stdout before the report line, stderr)."""
    code = _CHILD.format(module=module, argv=list(argv), heavy=HEAVY)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    *out, report = done.stdout.rstrip("\n").split("\n")
    got = json.loads(report)
    return got["status"], got["heavy"], "\n".join(out), done.stderr


TYPO = ("rlforge: error: unknown config key 'actor_rollout_ref.actor.optim.lrr'; "
        "did you mean 'actor_rollout_ref.actor.optim.lr'?\n")


@pytest.mark.e2e
@pytest.mark.parametrize("module, argv", [
    ("rlforge.cli", ["train", "actor_rollout_ref.actor.optim.lrr=1e-6"]),
    ("rlforge.trainer.main_ppo", ["actor_rollout_ref.actor.optim.lrr=1e-6"]),
    ("rlforge.cli", ["train", "--actor_rollout_ref.actor.optim.lrr", "1e-6"]),
])
def test_a_typo_is_reported_before_torch_loads(module: str, argv: list[str]) -> None:
    status, heavy, _, err = run_main(module, *argv)
    assert (status, err, heavy) == (2, TYPO, [])


@pytest.mark.e2e
@pytest.mark.parametrize("override, message", [
    # checked last by validate_config (rlforge.config.precision): every check before it ran too
    ("actor_rollout_ref.actor.fsdp_config.model_dtype=fp16",
     "actor_rollout_ref.actor.fsdp_config.model_dtype=fp16 keeps the actor's master weights in fp16"),
    # registry names, checked against the torch-free lists of rlforge.config.registry_names
    ("algorithm.adv_estimator=grpoo", "unknown advantage estimator 'grpoo' (algorithm.adv_estimator). "
     "Did you mean 'grpo'?"),
    ("actor_rollout_ref.actor.policy_loss.loss_mode=flowrll", "unknown policy loss 'flowrll'"),
    ("reward_model.reward_manager=nave", "unknown reward manager 'nave' (reward_model.reward_manager)"),
    ("actor_rollout_ref.model.lora_alpha=32", "actor_rollout_ref.model.lora_alpha=32 is set but "
     "actor_rollout_ref.model.lora_rank=0"),
    ("actor_rollout_ref.actor.megatron.tensor_model_parallel_size=0",
     "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=0: must be >= 1"),
])
def test_validation_refuses_a_value_before_torch_loads(override: str, message: str) -> None:
    argv = [override, "actor_rollout_ref.actor.strategy=megatron"] if ".megatron." in override else [override]
    status, heavy, _, err = run_main("rlforge.cli", "train", *argv)
    assert status == 2 and heavy == []
    assert err.startswith(f"rlforge: error: {message}") and err.count("\n") == 1, err


@pytest.mark.e2e
@pytest.mark.parametrize("module, argv, shown", [
    ("rlforge.cli", ["train", "--print-config"], "  train_files: builtin:arithmetic"),
    ("rlforge.trainer.main_ppo", ["--print-config", "actor_rollout_ref.model.lora_rank=8",
                                  "actor_rollout_ref.actor.policy_loss.loss_mode=flowrl"], "    lora_rank: 8"),
    # Hydra's flags and a defaults list (rlforge.config.hydra_compose): still no torch
    ("rlforge.trainer.main_ppo", ["--config-path=config", "--config-name=ppo_megatron_trainer.yaml",
                                  "--print-config", "~trainer.logger"], "    strategy: megatron"),
])
def test_print_config_needs_no_torch(module: str, argv: list[str], shown: str) -> None:
    status, heavy, out, _ = run_main(module, *argv)
    assert (status, heavy) == (0, [])
    assert out.startswith("data:\n") and shown in out.split("\n")  # the resolved YAML


@pytest.mark.e2e
def test_gsm8k_without_datasets_is_one_line_before_torch_loads() -> None:
    """``rlforge data gsm8k`` with no ``--src`` and no ``datasets`` package: the one-line hint, and no
    torch import first (it took 18.6 s on a busy machine).  ``datasets`` is hidden from the child."""
    code = ("import sys, json; sys.modules['datasets'] = None\n"
            "import importlib.util as u; real = u.find_spec\n"
            "u.find_spec = lambda n, *a: None if n == 'datasets' else real(n, *a)\n"
            "from rlforge.cli import main\nstatus = main(['data', 'gsm8k', '--out', 'unused'])\n"
            f"print(json.dumps({{'status': status, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=120)
    got = json.loads(done.stdout.strip().split("\n")[-1])
    assert got["status"] == 2 and not set(got["heavy"]) - {"numpy"}, done.stderr  # numpy: ~0.1 s
    assert done.stderr.count("\n") == 1 and "pip install datasets" in done.stderr


@pytest.mark.parametrize("module, argv", [
    ("rlforge.cli", ["train", "data.train_files=/nonexistent/adv/train.parquet"]),
    ("rlforge.trainer.main_ppo", ["data.train_files=builtin:arithmetic", "data.val_files=[/nonexistent/adv/test.parquet]"]),
])
def test_a_missing_data_file_is_reported_before_torch_loads(module: str, argv: list[str]) -> None:
    status, heavy, _, err = run_main(module, *argv)
    key = "data.train_files" if "train_files=/" in argv[-1] else "data.val_files"
    path = argv[-1].split("=", 1)[1].strip("[]")
    assert (status, heavy) == (2, [])  # verl's defaults (main_ppo) warn about vllm first: the error is the last line
    assert err.endswith(f"rlforge: error: {key}: data file not found: {path}\n")


@pytest.mark.parametrize("content, what", [(b"a,b\n1,2\n", "not in parquet format"), (b"", "empty"),
                                           (b"PAR1" + b"\0" * 40, "cut short")])
def test_a_parquet_file_that_is_not_parquet_is_reported_before_torch_loads(tmp_path, content, what) -> None:
    bad = tmp_path / "train.parquet"
    bad.write_bytes(content)
    status, heavy, _, err = run_main("rlforge.cli", "train", f"data.train_files={bad}")
    assert (status, heavy) == (2, [])
    assert err.endswith(f"rlforge: error: data.train_files: data file {bad} is not a parquet file ({what}: a parquet "
                        "file starts and ends with 'PAR1'); give a .parquet or .jsonl file\n")


def test_a_real_parquet_file_passes_the_early_check(tmp_path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlforge.config.data_files import _check_parquet_magic

    good = tmp_path / "train.parquet"
    pq.write_table(pa.table({"prompt": ["x"]}), good)
    _check_parquet_magic("data.train_files", str(good))  # no error

"""What ``rlforge train`` shows of warnings (rlforge.console_warnings): rlforge's own once each,
other libraries' (torch, transformers, peft) only under ``--verbose``, once each; under a launcher
only rank 0, and the config's warnings not again by the workers; kineto's log lines off."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import rlforge
from rlforge import cli
from rlforge.errors import RLForgeWarning
from rlforge.trainer import main_ppo

FSDP_NOTE = ("FSDP.state_dict_type() and FSDP.set_state_dict_type() are being deprecated. Please use APIs, "
             "get_state_dict() and set_state_dict(), which can support different parallelisms")
"""torch's FutureWarning of FSDP1's checkpointing (``strategy=fsdp``), as a user saw it."""


@pytest.fixture
def restore(monkeypatch):
    """Put back ``warnings.showwarning`` and the quiet environment after the command changed them."""
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    monkeypatch.setattr(cli, "_quiet_libraries", lambda: None)  # transformers' settings: not under test here
    for name in ("KINETO_LOG_LEVEL", "WORLD_SIZE", "RANK", "RLFORGE_RUN_START"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def _fake_run(*args, **kwargs) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # every call reaches the printer: it is the one that dedupes
        for _ in range(2):
            warnings.warn(FSDP_NOTE, FutureWarning, stacklevel=1)
            warnings.warn(FSDP_NOTE, FutureWarning, stacklevel=2)  # the same note from another place
            warnings.warn("NO_SHARD: full_state_dict will be returned", UserWarning, stacklevel=1)
            warnings.warn("actor_rollout_ref.model.use_liger=True: no kernels here", RLForgeWarning, stacklevel=1)
    return 0


def test_library_warnings_are_dropped_and_rlforge_warnings_printed_once(restore, capfd) -> None:
    restore.setattr(cli, "run_train", _fake_run)
    assert cli.main(["train"]) == 0
    err = capfd.readouterr().err
    assert err == "rlforge: warning: actor_rollout_ref.model.use_liger=True: no kernels here\n"
    assert os.environ["KINETO_LOG_LEVEL"] == "6"  # the profiler's kineto lines are off


@pytest.mark.parametrize("entry", [lambda argv: cli.main(["train", *argv]), main_ppo.main])
def test_verbose_shows_library_warnings_once(restore, capfd, entry) -> None:
    restore.setattr(cli, "run_train", _fake_run)
    assert entry(["--verbose"]) == 0
    lines = capfd.readouterr().err.splitlines()
    assert lines[0].startswith(f"rlforge: library warning: FutureWarning: {FSDP_NOTE} ({__file__}:")
    assert lines[1].startswith("rlforge: library warning: UserWarning: NO_SHARD: full_state_dict will be returned (")
    assert lines[2:] == ["rlforge: warning: actor_rollout_ref.model.use_liger=True: no kernels here"]
    assert "KINETO_LOG_LEVEL" not in os.environ  # --verbose: the profiler's own lines too


def test_config_warnings_once_by_the_users_process(restore, capfd) -> None:
    from rlforge.console_warnings import WarningPrinter, show_config_warnings

    restore.setattr(warnings, "showwarning", WarningPrinter().showwarning)
    show_config_warnings(["a=1: ignored", "a=1: ignored", "b=2: ignored"])
    assert capfd.readouterr().err == "rlforge: warning: a=1: ignored\nrlforge: warning: b=2: ignored\n"
    restore.setenv("WORLD_SIZE", "2")
    restore.setenv("RANK", "0")
    show_config_warnings(["c=3: ignored"])  # an external torchrun: rank 0 prints
    assert capfd.readouterr().err == "rlforge: warning: c=3: ignored\n"
    restore.setenv("RLFORGE_RUN_START", "1.0")  # a worker that rlforge train launched: its parent printed them
    show_config_warnings(["d=4: ignored"])
    restore.delenv("RLFORGE_RUN_START")
    restore.setenv("RANK", "1")
    show_config_warnings(["e=5: ignored"])
    warnings.warn("f=6: ignored", RLForgeWarning, stacklevel=1)  # a build-time warning: rank 0 only
    assert capfd.readouterr().err == ""


def _warn_calls_without_rlforge_category(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    if "warnings.warn(" not in text:
        return []
    tree = ast.parse(text)
    bad = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "warn"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "warnings"):
            given = [*node.args[1:2], *(k.value for k in node.keywords if k.arg == "category")]
            names = {n.id for g in given for n in ast.walk(g) if isinstance(n, ast.Name)}
            if not names & {"RLForgeWarning", "ConfigWarning"}:
                bad.append(f"{path}:{node.lineno}")
    return bad


def test_every_rlforge_warning_has_the_category_the_console_prints() -> None:
    """A ``warnings.warn`` in rlforge without :class:`RLForgeWarning` would be dropped as a library's."""
    root = Path(rlforge.__file__).parent
    bad = [b for p in sorted(root.rglob("*.py")) for b in _warn_calls_without_rlforge_category(p)]
    assert not bad, bad


@pytest.mark.e2e
def test_profiler_prints_no_kineto_lines(tmp_path) -> None:
    """The torch profiler of ``trainer.profile_steps`` prints no ``profiler_start``/``profiler_stop`` lines."""
    code = ("from rlforge.console_warnings import install; install()\n"
            "import torch\nfrom torch.profiler import profile, ProfilerActivity\n"
            "with profile(activities=[ProfilerActivity.CPU]):\n    torch.ones(3) + 1\n")
    env = {k: v for k, v in os.environ.items() if k != "KINETO_LOG_LEVEL"}
    env["PYTHONPATH"] = str(Path(rlforge.__file__).parent.parent)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "profiler_start" not in done.stderr + done.stdout and "USDT" not in done.stderr, done.stderr

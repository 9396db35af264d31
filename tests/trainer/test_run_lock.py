"""One run per run folder (``.rlforge.lock``): a second run stops with one clear message, a dead
run's lock is taken over, ``trainer.on_existing_run=append`` writes into a sub-folder."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess

import pytest
from helpers import FAST, SMALL

from rlforge.cli import main
from rlforge.errors import ConfigError
from rlforge.trainer import run_lock
from rlforge.trainer.run_lock import LOCK_FILE, acquire


@pytest.fixture
def live_pid():
    """The PID of a process that lives for the test (a sleeping child)."""
    p = subprocess.Popen(["sleep", "60"])
    yield p.pid
    p.kill()
    p.wait()


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid  # reaped: no process has it (PIDs are not reused this fast)


def hold(folder, pid: int, host: str | None = None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_FILE).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname(), "started": 0.0}))


def test_lock_records_pid_and_host_and_is_released(tmp_path):
    lock = acquire(tmp_path)
    data = json.loads((tmp_path / LOCK_FILE).read_text())
    assert data["pid"] == os.getpid() and data["host"] == socket.gethostname()
    assert lock.folder == tmp_path
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()
    acquire(tmp_path).release()  # free again


def test_second_acquire_names_folder_holder_and_fix(tmp_path, live_pid):
    hold(tmp_path, live_pid)
    with pytest.raises(ConfigError) as e:
        acquire(tmp_path)
    msg = str(e.value)
    for part in (str(tmp_path), f"PID {live_pid}", socket.gethostname(), "trainer.default_local_dir",
                 "trainer.experiment_name", "wait", "trainer.on_existing_run=append"):
        assert part in msg, (part, msg)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == live_pid  # the holder's lock is untouched


def test_stale_lock_of_dead_process_is_taken_over_with_warning(tmp_path, caplog):
    pid = dead_pid()
    hold(tmp_path, pid)
    with caplog.at_level(logging.WARNING, logger="rlforge"):
        lock = acquire(tmp_path)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    warnings = [r.getMessage() for r in caplog.records if r.name == run_lock.__name__]
    assert len(warnings) == 1 and f"PID {pid}" in warnings[0] and "no longer running" in warnings[0]
    lock.release()


def test_lock_of_another_host_is_respected(tmp_path):
    hold(tmp_path, dead_pid(), host="some-other-host")
    with pytest.raises(ConfigError, match="some-other-host"):
        acquire(tmp_path)


def test_append_writes_into_a_new_sub_folder(tmp_path, live_pid):
    hold(tmp_path, live_pid)
    lock = acquire(tmp_path, "append")
    assert lock.folder.parent == tmp_path and lock.folder.name.startswith("run-")
    assert json.loads((lock.folder / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == live_pid


def test_unknown_on_existing_run_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="trainer.on_existing_run='keep'"):
        acquire(tmp_path, "keep")


@pytest.mark.e2e
def test_second_training_run_in_a_busy_folder_stops_with_one_error(tmp_path, live_pid, capsys):
    hold(tmp_path, live_pid)
    rc = main(["train", *SMALL, *FAST, f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=1"])
    err = capsys.readouterr().err
    assert rc == 2
    errors = [line for line in err.splitlines() if line.startswith("rlforge: error: ")]
    assert len(errors) == 1 and f"PID {live_pid}" in errors[0] and str(tmp_path) in errors[0], err
    assert not (tmp_path / "metrics.jsonl").exists()  # nothing of the other run's folder was touched


@pytest.mark.e2e
def test_run_releases_its_lock_also_after_an_error(tmp_path, capsys):
    rc = main(["train", *SMALL, *FAST, f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=1",
               "trainer.save_freq=1", "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]"])
    assert rc == 0 and not (tmp_path / LOCK_FILE).exists()
    # a failing resume (another model shape) must not leave the folder locked
    rc = main(["train", *SMALL, *FAST, f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=2",
               "+actor_rollout_ref.model.override_config.num_hidden_layers=1"])
    assert rc == 2 and not (tmp_path / LOCK_FILE).exists()


@pytest.mark.e2e
def test_append_run_trains_in_its_sub_folder(tmp_path, live_pid):
    hold(tmp_path, live_pid)
    rc = main(["train", *SMALL, *FAST, f"trainer.default_local_dir={tmp_path}", "trainer.total_training_steps=1",
               "trainer.save_freq=1", "trainer.on_existing_run=append"])
    assert rc == 0
    (sub,) = [p for p in tmp_path.iterdir() if p.name.startswith("run-")]
    assert (sub / "metrics.jsonl").is_file() and (sub / "global_step_1" / "config.yaml").is_file()
    assert f"default_local_dir: {sub}" in (sub / "global_step_1" / "config.yaml").read_text()
    assert not (tmp_path / "metrics.jsonl").exists() and not (sub / LOCK_FILE).exists()


def test_two_starters_finding_one_dead_lock_never_both_hold_it(tmp_path, live_pid, monkeypatch):
    # B reads the dead lock; before B acts, A takes it over (A's fresh lock names a live PID). B must not delete
    # A's lock on the strength of its old read: it looks again and stops, naming A.
    hold(tmp_path, dead_pid())
    real, raced = run_lock.read_holder, []

    def read_then_a_takes_over(path):
        seen = real(path)
        if not raced:
            raced.append(1)
            hold(tmp_path, live_pid)
        return seen

    monkeypatch.setattr(run_lock, "read_holder", read_then_a_takes_over)
    with pytest.raises(ConfigError, match=f"PID {live_pid}"):
        acquire(tmp_path)
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == live_pid


def test_read_only_folder_is_one_error_naming_it(tmp_path, monkeypatch):
    import errno

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(run_lock.os, "open", read_only)
    with pytest.raises(ConfigError, match="Read-only file system") as e:
        acquire(tmp_path)
    assert f"trainer.default_local_dir={tmp_path}" in str(e.value)


@pytest.mark.e2e
def test_a_run_that_fails_before_it_starts_leaves_no_empty_folder(tmp_path, monkeypatch, capsys):
    """A model that cannot load (a Hub id, offline, not cached) stops the run after its folder was
    created for the lock: the folders it created are removed again, the parent it found is kept."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    out = tmp_path / "runs" / "qwen"
    rc = main(["train", *SMALL, *FAST, f"trainer.default_local_dir={out}", "trainer.total_training_steps=1",
               "actor_rollout_ref.model.path=NoSuchOrg/no-such-model"])
    assert rc == 2 and "NoSuchOrg/no-such-model" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() and tmp_path.is_dir()

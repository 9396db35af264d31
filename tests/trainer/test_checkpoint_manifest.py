"""Checkpoint checksums (``global_step_N/manifest.json``): written before the tracker names the
checkpoint, checked on resume; a corrupted file is one error, or the previous checkpoint with
``trainer.resume_fallback``; an older checkpoint without a manifest loads with one warning."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
import torch

from rlforge.errors import CheckpointError, ConfigError
from rlforge.trainer import checkpoint as ckpt
from rlforge.trainer.manifest import MANIFEST, verify_manifest, write_manifest


def save(root, step: int):
    parts = {"actor": {"model": {"w": torch.full((2048,), float(step))}, "optimizer": {"m": torch.ones(2048)}},
             "trainer_state": {"global_step": step}}
    return ckpt.save_checkpoint(root, step, parts, config="trainer:\n  total_training_steps: 3\n")


def flip(path, offset: int = 512, n: int = 4096) -> None:
    data = bytearray(path.read_bytes())
    for i in range(offset, min(offset + n, len(data))):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_manifest_lists_every_file_with_its_sha256_and_size(tmp_path):
    folder = save(tmp_path, 1)
    files = json.loads((folder / MANIFEST).read_text())["files"]
    assert set(files) == {"actor/state.pt", "trainer_state.pt", "config.yaml"}
    for rel, entry in files.items():
        raw = (folder / rel).read_bytes()
        assert entry == {"sha256": hashlib.sha256(raw).hexdigest(), "size": len(raw)}
    assert verify_manifest(folder) is True
    assert (tmp_path / ckpt.TRACKER).read_text() == "1"


def test_flipped_bytes_are_one_error_naming_the_file_and_checkpoint(tmp_path):
    folder = save(tmp_path, 1)
    flip(folder / "actor" / "state.pt")  # same size, 4 KiB of flipped bytes
    with pytest.raises(CheckpointError) as e:
        ckpt.pick_checkpoint("auto", tmp_path, None)
    msg = str(e.value)
    assert str(folder) in msg and "actor/state.pt" in msg and "SHA-256" in msg and "trainer.resume_fallback" in msg


@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_truncated_or_missing_file_is_named(tmp_path, damage):
    folder = save(tmp_path, 1)
    target = folder / "trainer_state.pt"
    if damage == "truncate":
        target.write_bytes(target.read_bytes()[:100])
    else:
        target.unlink()
    with pytest.raises(CheckpointError, match="trainer_state.pt"):
        verify_manifest(folder)


def test_fallback_takes_the_newest_older_checkpoint_that_verifies(tmp_path, caplog):
    for step in (1, 2, 3):
        save(tmp_path, step)
    flip(tmp_path / "global_step_3" / "actor" / "state.pt")
    flip(tmp_path / "global_step_2" / "trainer_state.pt", offset=0, n=64)
    with caplog.at_level(logging.WARNING, logger="rlforge"):
        got = ckpt.pick_checkpoint("auto", tmp_path, None, fallback=True)
    assert got == tmp_path / "global_step_1"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "global_step_3" in warnings[0] and "global_step_1" in warnings[0]


def test_fallback_with_nothing_older_is_an_error(tmp_path):
    save(tmp_path, 1)
    flip(tmp_path / "global_step_1" / "actor" / "state.pt")
    with pytest.raises(CheckpointError, match="no older checkpoint"):
        ckpt.pick_checkpoint("auto", tmp_path, None, fallback=True)


def test_checkpoint_without_manifest_loads_with_one_warning(tmp_path, caplog):
    folder = save(tmp_path, 1)
    (folder / MANIFEST).unlink()  # as an older rlforge wrote it
    with caplog.at_level(logging.WARNING, logger="rlforge"):
        assert ckpt.pick_checkpoint("auto", tmp_path, None) == folder
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no manifest.json" in warnings[0] and str(folder) in warnings[0]


def test_write_manifest_covers_nested_folders(tmp_path):
    (tmp_path / "actor" / "huggingface").mkdir(parents=True)
    (tmp_path / "actor" / "huggingface" / "config.json").write_text("{}")
    write_manifest(tmp_path)
    assert set(json.loads((tmp_path / MANIFEST).read_text())["files"]) == {"actor/huggingface/config.json"}
    (tmp_path / "actor" / "huggingface" / "config.json").write_text("{ }")
    with pytest.raises(CheckpointError, match="actor/huggingface/config.json"):
        verify_manifest(tmp_path)


@pytest.mark.parametrize("damage", ["bytes", "folder"])
def test_unreadable_tracker_file_is_one_error_naming_it(tmp_path, damage):
    save(tmp_path, 1)
    tracker = tmp_path / ckpt.TRACKER
    if damage == "bytes":
        tracker.write_bytes(b"\xff\xfe1")
    else:
        tracker.unlink()
        tracker.mkdir()
    with pytest.raises(ConfigError, match="not a complete checkpoint") as e:
        ckpt.pick_checkpoint("auto", tmp_path, None)
    assert str(tracker) in str(e.value)


@pytest.mark.parametrize("edit", ["empty", "outside"])
def test_a_manifest_that_does_not_describe_the_checkpoint_is_refused(tmp_path, edit):
    folder = save(tmp_path, 1)
    if edit == "empty":  # lists nothing, so nothing would be checked
        (folder / MANIFEST).write_text(json.dumps({"format": 1, "files": {}}))
        expected = "is not in manifest.json"
    else:  # a listed path that leaves the checkpoint
        files = json.loads((folder / MANIFEST).read_text())["files"]
        files["../../outside"] = {"sha256": "0" * 64, "size": 1}
        (folder / MANIFEST).write_text(json.dumps({"format": 1, "files": files}))
        expected = "outside the checkpoint"
    with pytest.raises(CheckpointError, match=expected):
        verify_manifest(folder)


def test_a_deleted_manifest_is_an_error_when_an_older_checkpoint_has_one(tmp_path):
    save(tmp_path, 1)
    folder = save(tmp_path, 2)
    (folder / MANIFEST).unlink()  # this rlforge wrote global_step_1's: global_step_2's was deleted, not old
    with pytest.raises(CheckpointError, match="global_step_2: manifest.json is missing, though the earlier checkpoint "
                                              "global_step_1 has one"):
        ckpt.pick_checkpoint("auto", tmp_path, None)
    assert ckpt.pick_checkpoint("auto", tmp_path, None, fallback=True) == tmp_path / "global_step_1"
    (tmp_path / "global_step_1" / MANIFEST).unlink()  # no manifest anywhere: an older rlforge's run, one warning
    assert verify_manifest(folder) is False

"""A rerun whose run folder holds only export-only saves (``save_contents=[hf_model]``, the default
job's) says in one warning that nothing could be resumed, and names the key that makes saves resumable."""

from __future__ import annotations

import logging

import torch

from rlforge.trainer.checkpoint import pick_checkpoint, save_checkpoint


def _export(folder):
    (folder / "model.safetensors").write_text("weights")


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_export_only_saves_give_one_warning_naming_the_key(tmp_path, caplog):
    for step in (1, 2):
        save_checkpoint(tmp_path, step, {}, exports={"actor/huggingface": _export}, config="a: 1\n", resumable=False)
    with caplog.at_level(logging.WARNING, logger="rlforge"):
        assert pick_checkpoint("auto", tmp_path, None) is None
    (line,) = _warnings(caplog)
    assert "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]" in line
    assert "global_step_2" in line and "step 0" in line and "2 global_step_*" in line


def test_no_warning_for_an_empty_folder_disable_or_a_resumable_checkpoint(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="rlforge"):
        assert pick_checkpoint("auto", tmp_path, None) is None  # a first run: nothing to say
        save_checkpoint(tmp_path, 1, {}, exports={"actor/huggingface": _export}, resumable=False)
        assert pick_checkpoint("disable", tmp_path, None) is None  # the user asked to start over
        parts = {"actor": {"model": {"w": torch.ones(2)}}, "trainer_state": {"global_step": 2}}
        save_checkpoint(tmp_path, 2, parts)
        assert pick_checkpoint("auto", tmp_path, None) == tmp_path / "global_step_2"
    assert _warnings(caplog) == []

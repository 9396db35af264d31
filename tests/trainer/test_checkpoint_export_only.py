"""``save_checkpoint(..., resumable=False)``: the export-only save of ``save_contents=[hf_model]``
replaces ``global_step_N`` like any save, never writes the tracker, and removes a tracker that
named the folder it replaced (so ``resume_mode=auto`` never points at a folder without a checkpoint)."""

from __future__ import annotations

import torch

from rlforge.trainer.checkpoint import TRACKER, find_resume_path, save_checkpoint


def _export(folder):
    (folder / "model.safetensors").write_text("weights")


def test_export_only_save_leaves_no_resumable_checkpoint(tmp_path):
    parts = {"actor": {"model": {"w": torch.ones(2)}}, "trainer_state": {"global_step": 2}}
    save_checkpoint(tmp_path, 2, parts, config="a: 1\n")
    assert (tmp_path / TRACKER).read_text() == "2" and find_resume_path("auto", tmp_path, None) == tmp_path / "global_step_2"

    save_checkpoint(tmp_path, 3, {}, exports={"actor/huggingface": _export}, config="a: 1\n", resumable=False)
    assert (tmp_path / TRACKER).read_text() == "2"  # another step's checkpoint stays the one to resume from
    assert sorted(p.name for p in (tmp_path / "global_step_3").iterdir()) == ["actor", "config.yaml"]
    assert (tmp_path / "global_step_3" / "actor" / "huggingface" / "model.safetensors").read_text() == "weights"

    save_checkpoint(tmp_path, 2, {}, exports={"actor/huggingface": _export}, resumable=False)
    assert not (tmp_path / TRACKER).exists()  # the checkpoint it named was replaced
    assert not (tmp_path / "global_step_2" / "trainer_state.pt").exists()
    assert find_resume_path("auto", tmp_path, None) is None
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folders left

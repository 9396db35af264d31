"""Saved Hugging Face folders follow the umask: ``safetensors`` alone leaves ``model.safetensors`` at
0600, which other users of a shared machine (or a serving container) cannot read."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from safetensors.torch import save_file

from rlforge.file_modes import current_umask
from rlforge.trainer.checkpoint import save_checkpoint
from rlforge.trainer.export import _write


@pytest.fixture(params=[0o022, 0o077, 0o002])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(p) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def _export(folder):
    save_file({"w": torch.ones(2)}, str(folder / "model.safetensors"))


def test_checkpoint_files_and_folders_follow_the_umask(tmp_path, umask):
    assert current_umask() == umask
    parts = {"actor": {"model": {"w": torch.ones(2)}}, "trainer_state": {"global_step": 1}}
    ckpt = save_checkpoint(tmp_path, 1, parts, exports={"actor/huggingface": _export}, config="a: 1\n")
    for p in [ckpt, *ckpt.rglob("*")]:
        want = (0o777 if p.is_dir() else 0o666) & ~umask
        assert _mode(p) == want, (p, oct(_mode(p)), oct(want))
    assert _mode(ckpt / "actor" / "huggingface" / "model.safetensors") == 0o666 & ~umask


class _Saver:
    def save_pretrained(self, folder):
        folder.mkdir(parents=True, exist_ok=True)
        _export(folder)


def test_export_folder_follows_the_umask(tmp_path, umask):
    out = tmp_path / "out"
    _write(out, _Saver(), _Saver())
    assert _mode(out / "model.safetensors") == 0o666 & ~umask and _mode(out) == 0o777 & ~umask

"""``rlforge sft`` prints one start line before the model loads, as ``rlforge train`` does."""

from __future__ import annotations

from rlforge.config.sft import load_sft_config
from rlforge.trainer.sft_trainer import sft_start_line


def test_start_line_names_model_data_length_device_and_output(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    cfg = load_sft_config(["model.path=preset:tiny", "trainer.device=cpu", "trainer.total_training_steps=7",
                           f"trainer.default_local_dir={tmp_path}"])
    assert sft_start_line(cfg) == (f"rlforge sft: start | model preset:tiny | data builtin:arithmetic | 7 steps "
                                   f"| device cpu | output {tmp_path}")
    monkeypatch.setenv("WORLD_SIZE", "2")  # under torchrun: the processes, and epochs when no step count is set
    cfg = load_sft_config(["model.path=preset:tiny", "trainer.device=cpu", "trainer.total_epochs=3",
                           f"trainer.default_local_dir={tmp_path}"])
    assert sft_start_line(cfg) == (f"rlforge sft: start | model preset:tiny | data builtin:arithmetic | 3 epochs "
                                   f"| device cpu x 2 processes | output {tmp_path}")

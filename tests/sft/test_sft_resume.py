"""Resuming an SFT run (``trainer.resume_mode``): an uninterrupted run and one interrupted after step 3 and
resumed give the same losses, learning rates and weights for steps 4.. (within 1e-6), with a warmup+cosine
schedule, attention dropout (the RNG) and an epoch boundary after the resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rlforge.config.sft import load_sft_config
from rlforge.errors import CheckpointError, ConfigError
from rlforge.trainer.resume_config import check_resume_config
from rlforge.trainer.sft_resume import SFT_FROZEN, pick_sft_checkpoint

SFT = ["model.path=preset:tiny", "trainer.device=cpu", "data.builtin.train_size=32", "data.train_batch_size=8",
       "data.micro_batch_size_per_gpu=4", "data.max_length=64", "data.max_token_len_per_gpu=128",
       "optim.lr=5e-3", "optim.lr_warmup_steps=2", "optim.lr_scheduler_type=cosine", "optim.min_lr_ratio=0.1",
       "model.override_config={attention_dropout: 0.2}", "trainer.total_training_steps=7", "trainer.save_freq=3",
       "trainer.logger=[file]"]
"""4 steps per epoch: the resumed part (steps 4..7) crosses into the second epoch."""


def _metrics(folder: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows}


@pytest.mark.e2e
def test_interrupted_and_resumed_run_matches_an_uninterrupted_one(tmp_path, capsys):
    from rlforge.trainer.sft_trainer import SFTTrainer, main

    whole = SFTTrainer(load_sft_config([*SFT, f"trainer.default_local_dir={tmp_path / 'whole'}"]))
    assert whole.resumed_from is None
    whole.fit()
    final = whole._hf_state()

    cut = tmp_path / "cut"
    first = SFTTrainer(load_sft_config([*SFT, f"trainer.default_local_dir={cut}"]))
    step = first.train_step

    def interrupt(n: int) -> dict[str, float]:
        if n == 4:
            raise KeyboardInterrupt  # killed after step 3's checkpoint
        return step(n)

    first.train_step = interrupt
    with pytest.raises(KeyboardInterrupt):
        first.fit()
    assert (cut / "latest_checkpointed_iteration.txt").read_text() == "3"

    again = SFTTrainer(load_sft_config([*SFT, f"trainer.default_local_dir={cut}"]))  # resume_mode=auto
    assert again.resumed_from == cut / "global_step_3" and again.global_step == 3
    assert "resumed from" in capsys.readouterr().out
    again.fit()
    ref, got = _metrics(tmp_path / "whole"), _metrics(cut)
    assert sorted(got) == list(range(1, 8))
    for n in range(4, 8):
        for key in ("train/loss", "train/lr", "train/grad_norm"):
            assert got[n][key] == pytest.approx(ref[n][key], rel=0, abs=1e-6), (n, key)
    assert ref[4]["train/loss"] != ref[3]["train/loss"]
    resumed = again._hf_state()
    for name, t in final.items():
        torch.testing.assert_close(resumed[name], t, rtol=1e-6, atol=1e-6)

    # the same folder with another model: one line naming the key, nothing trained
    capsys.readouterr()
    rc = main([*SFT, f"trainer.default_local_dir={cut}", "model.override_config={attention_dropout: 0.0}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "model.override_config" in err[0] and "global_step_7" in err[0], err
    # resume_path from the step-3 checkpoint into another folder
    other = tmp_path / "other"
    again = SFTTrainer(load_sft_config([*SFT, f"trainer.default_local_dir={other}", "trainer.resume_mode=resume_path",
                                        f"trainer.resume_from_path={cut / 'global_step_3'}"]))
    assert again.global_step == 3
    again.fit()
    assert _metrics(other)[5]["train/loss"] == pytest.approx(ref[5]["train/loss"], rel=0, abs=1e-6)


def _fake_checkpoint(folder: Path, step: int) -> Path:
    ck = folder / f"global_step_{step}"
    ck.mkdir(parents=True)
    (ck / "trainer_state.pt").write_bytes(b"x")
    (folder / "latest_checkpointed_iteration.txt").write_text(str(step))
    return ck


def test_pick_follows_verl_resume_modes(tmp_path, caplog):
    def pick(*overrides: str):
        return pick_sft_checkpoint(load_sft_config([f"trainer.default_local_dir={tmp_path / 'run'}",
                                                    *overrides]).trainer)

    assert pick() is None  # auto, nothing saved yet
    latest = _fake_checkpoint(tmp_path / "run", 4)
    elsewhere = _fake_checkpoint(tmp_path / "old", 2)
    assert pick() == latest
    assert pick("trainer.resume_mode=disable") is None
    assert pick(f"trainer.resume_from_path={elsewhere}") == elsewhere  # auto takes resume_from_path, as verl
    assert pick("trainer.resume_mode=resume_path", f"trainer.resume_from_path={elsewhere}") == elsewhere
    with pytest.raises(ConfigError, match="trainer.resume_from_path=.*not a complete rlforge checkpoint"):
        pick("trainer.resume_mode=resume_path", f"trainer.resume_from_path={tmp_path}")
    with pytest.raises(ConfigError, match="trainer.resume_mode=resume_path needs trainer.resume_from_path"):
        load_sft_config(["trainer.resume_mode=resume_path"])
    with pytest.raises(ConfigError, match="trainer.resume_mode='latest': expected one of auto, disable, resume_path"):
        load_sft_config(["trainer.resume_mode=latest"])


def test_frozen_sft_keys(tmp_path):
    (tmp_path / "config.yaml").write_text("model:\n  path: preset:tiny\n  lora_rank: 0\noptim:\n  lr: 0.1\n"
                                          "trainer:\n  resume_mode: auto\n")
    changes = check_resume_config(tmp_path, "config.yaml", "model:\n  path: preset:tiny\n  lora_rank: 0\n"
                                  "optim:\n  lr: 0.2\ntrainer:\n  resume_mode: resume_path\n", SFT_FROZEN)
    assert [str(c) for c in changes] == ["optim.lr: 0.1 -> 0.2"]
    with pytest.raises(CheckpointError, match=r"different model.lora_rank: 0 -> 8 \(checkpoint -> now\)"):
        check_resume_config(tmp_path, "config.yaml", "model:\n  path: preset:tiny\n  lora_rank: 8\n", SFT_FROZEN)

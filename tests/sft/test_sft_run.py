"""A short SFT run on the built-in arithmetic task lowers the loss, and its output folder is a model
that ``rlforge train`` takes as ``actor_rollout_ref.model.path``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1]))
from helpers import FAST, SMALL  # noqa: E402

pytestmark = pytest.mark.e2e

SFT = ["model.path=preset:tiny", "trainer.device=cpu", "data.builtin.train_size=64", "data.train_batch_size=8",
       "data.micro_batch_size_per_gpu=4", "data.max_length=64", "data.max_token_len_per_gpu=128",
       "optim.lr=1e-2", "optim.lr_scheduler=constant", "trainer.total_training_steps=20", "trainer.logger=[file]"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    from rlforge.config.sft import load_sft_config
    from rlforge.trainer.sft_trainer import SFTTrainer

    out = tmp_path_factory.mktemp("sft")
    trainer = SFTTrainer(load_sft_config([*SFT, f"trainer.default_local_dir={out}"]))
    trainer.fit()
    return trainer, out


def test_loss_goes_down(run):
    _, out = run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train/loss"] for r in rows if "train/loss" in r]
    assert len(losses) == 20
    assert sum(losses[-3:]) / 3 < 0.5 * losses[0]  # ~10.8 (uniform over the vocabulary) -> ~2


def test_output_folder_is_the_trained_model(run, tiny_tokenizer):
    from rlforge.models import load_causal_lm

    trainer, out = run
    folder = out / "global_step_20" / "huggingface"
    model = load_causal_lm(str(folder), tiny_tokenizer).eval()
    final = trainer._hf_state()
    for name, t in model.state_dict().items():
        torch.testing.assert_close(t, final[name], rtol=0, atol=0)
    batch = trainer._collate(trainer.train[:4])
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        ref = trainer.engine.module(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(logits, ref, rtol=1e-5, atol=1e-5)


def test_rlforge_train_takes_the_folder(run, tmp_path):
    from rlforge.cli import main

    _, out = run
    folder = out / "global_step_20" / "huggingface"
    rc = main(["train", *SMALL, *FAST, f"actor_rollout_ref.model.path={folder}", "trainer.total_training_steps=1",
               f"trainer.default_local_dir={tmp_path}"])
    assert rc == 0
    assert (tmp_path / "metrics.jsonl").is_file()


def test_a_skipped_update_is_said_and_a_nan_loss_stops(capsys):
    """verl's SFT trainer skips the optimizer update of a step whose gradient norm is not finite; rlforge
    does too, and says so on rank 0.  A NaN loss stops the run with one line."""
    import math

    from rlforge.errors import RLForgeError
    from rlforge.trainer.sft_trainer import _check_finite

    _check_finite(3, 1.5, 2.0, 1e-5, 0)
    assert capsys.readouterr().err == ""
    _check_finite(3, 1.5, math.nan, 1e-5, 0)
    assert capsys.readouterr().err == ("rlforge sft: warning: step 3: the gradient norm is nan; this step's optimizer "
                                       "update was skipped (lower optim.lr=1e-05 or optim.clip_grad if this repeats)\n")
    _check_finite(3, 1.5, math.inf, 1e-5, 1)  # another rank: rank 0 speaks
    assert capsys.readouterr().err == ""
    with pytest.raises(RLForgeError, match=r"^step 4: the SFT loss is nan .*optim.lr=0.1 "):
        _check_finite(4, math.nan, math.nan, 0.1, 0)

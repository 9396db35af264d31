"""The SFT config's ``engine`` block (verl's ``engine: fsdp`` keys) reaches the training engine."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.e2e  # builds a trainer (a one-rank process group)

BASE = ["model.path=preset:tiny", "trainer.device=cpu", "data.builtin.train_size=16", "data.train_batch_size=8",
        "data.max_length=64", "data.max_token_len_per_gpu=128", "trainer.total_training_steps=1",
        "trainer.logger=[file]"]


@pytest.mark.parametrize(("overrides", "dtype"), [([], torch.float32),
                                                  (["engine.model_dtype=bf16"], torch.bfloat16),
                                                  (["model.fsdp_config.model_dtype=bf16"], torch.bfloat16)])
def test_engine_model_dtype_reaches_the_master_weights(tmp_path, overrides, dtype):
    from rlforge.config.sft import load_sft_config
    from rlforge.trainer.sft_trainer import SFTTrainer

    trainer = SFTTrainer(load_sft_config([*BASE, f"trainer.default_local_dir={tmp_path}", *overrides]))
    dtypes = {p.dtype for p in trainer.engine.module.parameters()}
    assert dtypes == {dtype}, dtypes

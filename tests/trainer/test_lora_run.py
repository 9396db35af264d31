"""A LoRA GRPO run end to end (``rlforge train`` in-process on ``preset:tiny``, FSDP2 on one rank,
KL loss against the adapter-off reference): its checkpoints hold the adapter, resume is bit-exact,
and the exported adapter (``rlforge export``, and the run's own ``hf_model`` folder) loads with
``peft.PeftModel.from_pretrained`` and gives the log-probs of the rollout's merged copy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from helpers import FAST, SMALL, left_padded_batch

from rlforge.cli import main

pytestmark = pytest.mark.e2e

LORA = [*FAST, "actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.optim.lr=1e-2", "actor_rollout_ref.actor.entropy_coeff=0.01",
        "data.seed=1", "data.builtin.train_size=8", "trainer.save_freq=1",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra,hf_model]"]


@pytest.fixture(scope="module")
def run_a(tmp_path_factory):
    """Two steps, a checkpoint after each; the job (its rollout copy) is kept."""
    import rlforge.trainer.ppo_trainer as trainer_mod

    out = tmp_path_factory.mktemp("lora_a")
    jobs = []
    real = trainer_mod.build_job
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer_mod, "build_job", lambda cfg: jobs.append(real(cfg)) or jobs[-1])
        assert main(["train", *SMALL, *LORA, "trainer.total_training_steps=2", f"trainer.default_local_dir={out}"]) == 0
    return out, jobs[0]


def _state(folder: Path) -> dict:
    return torch.load(folder / "actor" / "state.pt", weights_only=False)


def test_checkpoint_holds_the_adapter_and_resume_is_bit_exact(run_a, tmp_path):
    out, _ = run_a
    a2 = _state(out / "global_step_2")
    assert a2["model"] and all(".lora_A." in k or ".lora_B." in k for k in a2["model"])  # no base weights saved
    assert len(a2["optimizer"]["state"]) == len(a2["model"]) and a2["lora"]["config"]["r"] == 4
    b = tmp_path / "b"
    b.mkdir()
    shutil.copytree(out / "global_step_1", b / "global_step_1")
    (b / "latest_checkpointed_iteration.txt").write_text("1")
    assert main(["train", *SMALL, *LORA, "trainer.total_training_steps=2", f"trainer.default_local_dir={b}",
                 "trainer.resume_mode=auto"]) == 0
    b2 = _state(b / "global_step_2")
    a1 = _state(out / "global_step_1")
    assert any(not torch.equal(a1["model"][k], v) for k, v in a2["model"].items())  # step 2 moved the adapter
    for k, v in a2["model"].items():
        assert torch.equal(b2["model"][k], v), k
    for i, s in a2["optimizer"]["state"].items():
        for name, t in s.items():
            assert torch.equal(torch.as_tensor(b2["optimizer"]["state"][i][name]), torch.as_tensor(t)), (i, name)


def _log_probs(model, batch) -> torch.Tensor:
    from rlforge.roles.forward import response_log_probs

    with torch.no_grad():
        return response_log_probs(model.eval(), batch, 1.0, with_entropy=False)[0][batch["response_mask"].bool()]


def test_exported_adapter_loads_with_peft(run_a, tmp_path, tiny_tokenizer):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlforge.models import load_causal_lm

    out, job = run_a
    ckpt = out / "global_step_2"
    assert main(["export", str(ckpt), "--out", str(tmp_path / "adapter")]) == 0
    assert main(["export", str(ckpt), "--out", str(tmp_path / "merged"), "--merge"]) == 0
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    batch = left_padded_batch(tiny_tokenizer.pad_token_id, 2, [3, 6, 4], [2, None, 5], 7)
    rollout_copy = _log_probs(job.rollout_model, batch)  # the rollout's plain copy, synced (merged) after step 2

    def base():
        return load_causal_lm("preset:tiny", tiny_tokenizer, seed=1)  # the run's base weights (data.seed=1)

    base_lp = _log_probs(base(), batch)
    assert (rollout_copy - base_lp).abs().max() > 1e-4  # the adapter changed the policy
    for folder in (tmp_path / "adapter", ckpt / "actor" / "huggingface"):  # export, and the run's hf_model
        peft_lp = _log_probs(PeftModel.from_pretrained(base(), str(folder)), batch)
        assert torch.allclose(peft_lp, rollout_copy, atol=1e-5, rtol=0), (folder, (peft_lp - rollout_copy).abs().max())
    merged_lp = _log_probs(AutoModelForCausalLM.from_pretrained(tmp_path / "merged"), batch)
    assert torch.allclose(merged_lp, rollout_copy, atol=1e-5, rtol=0)


def test_lora_adapter_path_starts_from_the_adapter(run_a, tmp_path):
    """A job built with ``lora_adapter_path`` (the exported folder) starts with that adapter: its
    rollout copy and its actor give the trained run's log-probs; its reference stays the base."""
    import rlforge.config
    from rlforge.trainer.build import build_job

    out, job_a = run_a
    folder = out / "global_step_2" / "actor" / "huggingface"
    cfg = rlforge.config.load_config([*SMALL, *LORA, "actor_rollout_ref.model.lora_rank=0",
                                      f"actor_rollout_ref.model.lora_adapter_path={folder}",
                                      f"trainer.default_local_dir={tmp_path}"], job="default")
    job = build_job(cfg)
    batch = left_padded_batch(job.tokenizer.pad_token_id, 2, [3, 6, 4], [2, None, 5], 7)
    want = _log_probs(job_a.rollout_model, batch)
    assert torch.allclose(_log_probs(job.rollout_model, batch), want, atol=1e-5, rtol=0)
    mask = batch["response_mask"].bool()
    assert torch.allclose(job.actor.compute_log_prob(batch, 1.0)["log_probs"][mask], want, atol=1e-5, rtol=0)
    assert (job.reference.compute_log_prob(batch, 1.0)["log_probs"][mask] - want).abs().max() > 1e-4

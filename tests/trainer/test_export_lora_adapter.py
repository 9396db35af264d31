"""``rlforge export CKPT --out DIR --merge`` on a LoRA run's export-only save (``save_contents=[hf_model]``,
the default: ``global_step_N/actor/huggingface`` is a peft adapter folder, with the run's ``config.yaml``)
writes the base model with the adapter merged in.  References: peft's own ``merge_and_unload`` of the
same adapter on the same base, and ``W + alpha/r * B @ A`` by hand for one layer."""

from __future__ import annotations

import copy
import os

import pytest
import torch

from rlforge.cli import main

pytestmark = pytest.mark.e2e  # runs `rlforge export` end to end

TOK = os.environ.get("RLFORGE_TEST_TOKENIZER") or None


def _one_error(capsys) -> str:
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("rlforge: error: ")]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def _adapter_run(run):
    """A run folder as a LoRA job with save_contents=[hf_model] leaves it; returns the peft model."""
    from peft import LoraConfig, get_peft_model

    from rlforge.models import load_causal_lm, load_tokenizer

    base = load_causal_lm("preset:tiny", load_tokenizer("preset:tiny", TOK), seed=1)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:  # peft starts B at zero: a trained adapter has moved it
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    hf = run / "global_step_2" / "actor" / "huggingface"
    peft_model.save_pretrained(hf)
    tok_line = f"    tokenizer_path: {TOK}\n" if TOK else ""
    (run / "global_step_2" / "config.yaml").write_text(
        f"actor_rollout_ref:\n  model:\n    path: preset:tiny\n{tok_line}data:\n  seed: 1\n")
    return peft_model, hf


def test_merge_of_an_adapter_only_save_matches_peft(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    run = tmp_path / "run"
    peft_model, hf = _adapter_run(run)
    assert main(["export", str(run), "--out", str(tmp_path / "plain")]) == 2  # without --merge: what to do
    line = _one_error(capsys)
    assert "LoRA adapter folder" in line and "--merge" in line and str(hf) in line

    a = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    by_hand = (a.base_layer.weight + 2.0 * a.lora_B["default"].weight @ a.lora_A["default"].weight).detach().clone()
    want = copy.deepcopy(peft_model).merge_and_unload().state_dict()
    for ckpt in (run, run / "global_step_2"):  # a run folder and its global_step_N folder
        out = tmp_path / f"merged-{ckpt.name}"
        assert main(["export", str(ckpt), "--out", str(out), "--merge"]) == 0
        got = AutoModelForCausalLM.from_pretrained(out).state_dict()
        assert got.keys() == want.keys()
        for k, v in want.items():
            torch.testing.assert_close(got[k], v, atol=0, rtol=0, msg=k)
        torch.testing.assert_close(got["model.layers.0.self_attn.q_proj.weight"], by_hand, atol=1e-6, rtol=0)
        assert (out / "tokenizer_config.json").is_file() and not (out / "adapter_config.json").exists()


def test_full_model_save_with_merge_names_the_folder_to_load(tmp_path, capsys):
    hf = tmp_path / "global_step_3" / "actor" / "huggingface"
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    assert main(["export", str(tmp_path), "--out", str(tmp_path / "x"), "--merge"]) == 2
    assert f"needs no export: load {hf} as it is" in _one_error(capsys)
    assert not (tmp_path / "x").exists()

"""Log-probs of ``roles.forward.response_log_probs`` against a plain per-sequence forward,
and the model loader's errors and preset shapes."""

from __future__ import annotations

import pytest
import torch

from rlforge.batch import Batch
from rlforge.errors import ModelError
from rlforge.models import PRESETS, load_causal_lm, resolve_source
from rlforge.models.presets import preset_config
from rlforge.roles.forward import response_log_probs
from rlforge.rollout.base import assemble

EOS = 2  # an id used as EOS in these hand-built batches; random tokens are drawn from [100, 1000)


def left_padded_prompts(prompts: list[list[int]], pad_id: int) -> Batch:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    return Batch.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def reference_log_probs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """log softmax(logits / T)[token] of each response token, from one unpadded forward."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0].double() / temperature
    logp = torch.log_softmax(logits, -1)
    positions = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    return logp[positions, torch.tensor(response)].float()


def make_case(padded: bool, pad_id: int):
    g = torch.Generator().manual_seed(0)

    def rand(n: int) -> list[int]:
        return torch.randint(100, 1000, (n,), generator=g).tolist()

    if padded:
        prompts = [rand(3), rand(7), rand(5)]
        # EOS in the middle, no EOS (runs to the full width), EOS right after one token
        raw = [rand(3) + [EOS] + rand(2), rand(6), rand(1) + [EOS] + rand(4)]
    else:
        prompts = [rand(5), rand(5)]
        raw = [rand(6), rand(6)]
    batch = assemble(left_padded_prompts(prompts, pad_id), torch.tensor(raw), [EOS], pad_id)
    # the unpadded responses: up to and including the first EOS
    responses = [r[: r.index(EOS) + 1] if EOS in r else r for r in raw]
    return batch, prompts, responses


@pytest.mark.parametrize("padded", [False, True], ids=["no-padding", "left-and-right-padding"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_response_log_probs_match_unpadded_forward(tiny_model, tiny_tokenizer, padded, temperature):
    pad_id = tiny_tokenizer.pad_token_id
    batch, prompts, responses = make_case(padded, pad_id)
    if padded:
        assert batch["attention_mask"].min() == 0  # the case really has padding on both sides
    with torch.no_grad():
        logp, ent = response_log_probs(tiny_model, batch, temperature, with_entropy=True)
    assert logp.dtype == torch.float32 and logp.shape == batch["responses"].shape
    assert ent is not None and ent.shape == logp.shape
    for i, (p, r) in enumerate(zip(prompts, responses, strict=True)):
        ref = reference_log_probs(tiny_model, p, r, temperature)
        assert int(batch["response_mask"][i].sum()) == len(r)
        torch.testing.assert_close(logp[i, : len(r)], ref, atol=1e-5, rtol=0)


def test_temperature_changes_log_probs(tiny_model, tiny_tokenizer):
    """Guards the test above: T=0.7 and T=1 must differ, or the temperature check proves nothing."""
    batch, _, _ = make_case(False, tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        a, _ = response_log_probs(tiny_model, batch, 1.0, with_entropy=False)
        b, _ = response_log_probs(tiny_model, batch, 0.7, with_entropy=False)
    assert (a - b).abs().max() > 1e-3


def test_entropy_matches_definition(tiny_model, tiny_tokenizer):
    batch, prompts, responses = make_case(False, tiny_tokenizer.pad_token_id)
    with torch.no_grad():
        _, ent = response_log_probs(tiny_model, batch, 0.7, with_entropy=True)
        ids = torch.tensor([prompts[0] + responses[0]])
        logits = tiny_model(ids).logits[0].double() / 0.7
    logp = torch.log_softmax(logits, -1)
    ref = -(logp.exp() * logp).sum(-1)[len(prompts[0]) - 1: -1].float()
    torch.testing.assert_close(ent[0], ref, atol=1e-4, rtol=1e-5)


# ---------------------------------------------------------------------------- loader errors


def test_missing_path_names_key_and_path(tiny_tokenizer, tmp_path):
    missing = str(tmp_path / "no_such_model")
    with pytest.raises(ModelError) as e:
        load_causal_lm(missing, tiny_tokenizer, key="critic.model.path")
    assert "critic.model.path" in str(e.value) and missing in str(e.value)
    with pytest.raises(ModelError) as e:
        resolve_source(missing)
    assert "actor_rollout_ref.model.path" in str(e.value) and missing in str(e.value)


def test_folder_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelError, match="config.json"):
        resolve_source(str(tmp_path))


def test_tokenizer_path_may_be_a_saved_tokenizer_alone(tiny_tokenizer, tmp_path):
    from rlforge.models import load_tokenizer

    folder = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(str(folder))
    assert not (folder / "config.json").exists()
    tok = load_tokenizer("preset:tiny", str(folder))
    text = "Natalia sold 48 clips in April."
    assert tok(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]
    assert tok.eos_token == tiny_tokenizer.eos_token and tok.chat_template == tiny_tokenizer.chat_template
    # an empty folder is still refused with the key's name
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="model.tokenizer_path"):
        load_tokenizer("preset:tiny", str(tmp_path / "empty"))


def test_unknown_preset_lists_valid_presets():
    with pytest.raises(ModelError) as e:
        resolve_source("preset:nope")
    msg = str(e.value)
    assert "'nope'" in msg
    for name in PRESETS:
        assert name in msg


def test_preset_source():
    src = resolve_source("preset:tiny")
    assert (src.kind, src.location) == ("preset", "tiny")


def test_qwen25_05b_preset_has_published_shapes():
    # Qwen/Qwen2.5-0.5B config.json
    cfg = preset_config("qwen2.5-0.5b", tokenizer_vocab_size=49152)
    assert cfg.model_type == "qwen2"
    assert cfg.hidden_size == 896
    assert cfg.num_hidden_layers == 24
    assert cfg.num_attention_heads == 14
    assert cfg.num_key_value_heads == 2
    assert cfg.intermediate_size == 4864
    assert cfg.vocab_size == 151936
    assert cfg.tie_word_embeddings is True
    rope = getattr(cfg, "rope_parameters", None) or {"rope_theta": cfg.rope_theta}
    assert rope["rope_theta"] == 1_000_000.0


def test_preset_vocab_grows_to_tokenizer_and_overrides_apply():
    cfg = preset_config("tiny", tokenizer_vocab_size=49152, overrides={"num_hidden_layers": 1})
    assert cfg.vocab_size == 49152 and cfg.num_hidden_layers == 1

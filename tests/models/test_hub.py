"""Hugging Face Hub ids as model paths (``rlforge.models.hub``), against a local Hugging Face
cache laid out as ``snapshot_download`` leaves it (``models--org--name/snapshots/<hash>``,
``refs/main``), offline: no test touches the network."""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest
import torch

from rlforge.errors import ModelError
from rlforge.models import ModelSource, load_causal_lm, load_tokenizer, load_value_model, resolve_source
from rlforge.models.hub import is_hub_id

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _use_cache(monkeypatch: pytest.MonkeyPatch, cache: Path, offline: bool = True) -> None:
    """Point huggingface_hub at ``cache`` as ``HF_HUB_CACHE=cache HF_HUB_OFFLINE=1`` would at start-up
    (huggingface_hub reads its environment once, on import, into ``constants``)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", offline)


def _snapshot(cache: Path, repo_id: str) -> Path:
    org, name = repo_id.split("/")
    repo = cache / f"models--{org}--{name}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    return repo / "snapshots" / COMMIT


@pytest.fixture
def tiny_hub(tmp_path, monkeypatch):
    """A preset:tiny model (word-level tokenizer, 110 tokens) saved as the cached Hub repo
    ``org/tiny`` and its tokenizer alone as ``org/tok``; HF_HUB_OFFLINE=1.  Returns
    ``(model, tokenizer, snapshot folder)``."""
    tok = load_tokenizer("preset:tiny", "builtin:integers")
    model = load_causal_lm("preset:tiny", tok, seed=0).eval()
    cache = tmp_path / "hf-cache"
    snap = _snapshot(cache, "org/tiny")
    model.save_pretrained(snap)
    tok.save_pretrained(snap)
    tok.save_pretrained(_snapshot(cache, "org/tok"))
    _use_cache(monkeypatch, cache)
    monkeypatch.chdir(tmp_path)  # no local folder named org/
    return model, tok, snap


def _logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


def test_hub_id_loads_the_cached_model_offline(tiny_hub):
    model, tok, snap = tiny_hub
    assert resolve_source("org/tiny") == ModelSource("hf", str(snap))
    hub_tok = load_tokenizer("org/tiny")
    ids = hub_tok("1 2 3 + 4")["input_ids"]
    assert ids == tok("1 2 3 + 4")["input_ids"] and len(hub_tok) == len(tok)
    hub_model = load_causal_lm("org/tiny", hub_tok).eval()
    local_model = load_causal_lm(str(snap), tok).eval()
    torch.testing.assert_close(_logits(hub_model, ids), _logits(model, ids), rtol=0, atol=0)
    torch.testing.assert_close(_logits(hub_model, ids), _logits(local_model, ids), rtol=0, atol=0)
    # the critic's backbone comes from the same snapshot (critic.model.path=org/tiny)
    critic = load_value_model("org/tiny", hub_tok, key="critic.model.path")
    torch.testing.assert_close(critic.model.embed_tokens.weight, model.model.embed_tokens.weight, rtol=0, atol=0)


def test_hub_tokenizer_path_and_local_folder_wins(tiny_hub, tmp_path):
    model, tok, _ = tiny_hub
    # model.tokenizer_path=org/tok: a cached repo holding only a tokenizer
    assert load_tokenizer("preset:tiny", "org/tok")("7 8")["input_ids"] == tok("7 8")["input_ids"]
    # a local folder that exists wins over the Hub id it spells
    other = load_causal_lm("preset:tiny", tok, seed=1)
    other.save_pretrained(tmp_path / "org" / "tiny")
    assert resolve_source("org/tiny") == ModelSource("hf", "org/tiny")
    ids = tok("5 6")["input_ids"]
    loaded = load_causal_lm("org/tiny", tok).eval()
    torch.testing.assert_close(_logits(loaded, ids), _logits(other.eval(), ids), rtol=0, atol=0)


def _one_line(e: pytest.ExceptionInfo[ModelError]) -> str:
    msg = str(e.value)
    no_chain = e.value.__cause__ is None and (e.value.__context__ is None or e.value.__suppress_context__)
    assert "\n" not in msg and no_chain, msg  # the CLI prints it as it is: one line, no traceback
    return msg


def test_offline_model_missing_from_cache_is_one_line(tiny_hub, tmp_path):
    with pytest.raises(ModelError) as e:
        load_causal_lm("Qwen/Qwen2.5-0.5B-Instruct", tiny_hub[1], key="critic.model.path")
    msg = _one_line(e)
    for part in ("critic.model.path=Qwen/Qwen2.5-0.5B-Instruct", "not in the local Hugging Face cache",
                 str(tmp_path / "hf-cache"), "HF_HUB_OFFLINE=1", "hf download Qwen/Qwen2.5-0.5B-Instruct",
                 "local model folder"):
        assert part in msg, (part, msg)
    with pytest.raises(ModelError) as e:  # the tokenizer's key when tokenizer_path names it
        load_tokenizer("preset:tiny", "org/missing")
    assert _one_line(e).startswith("model.tokenizer_path=org/missing: the model is not in the local Hugging Face cache")


def test_unreachable_hub_and_model_missing_from_cache_is_one_line(tmp_path, monkeypatch):
    """Online, but the Hub cannot be reached (a closed local port stands for a machine without network)."""
    _use_cache(monkeypatch, tmp_path / "hf-cache", offline=False)
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(ModelError) as e:
        resolve_source("org/absent")
    msg = _one_line(e)
    assert "not in the local Hugging Face cache" in msg and "the Hugging Face Hub cannot be reached" in msg, msg
    assert "hf download org/absent" in msg


@pytest.mark.parametrize("path, hub", [
    ("Qwen/Qwen2.5-0.5B-Instruct", True), ("org/tiny", True),
    ("gpt2", False), ("./org/tiny", False), ("/models/org", False), ("~/org/tiny", False),
    ("a/b/c", False), ("org/", False), ("a--b/c", False), ("org/name with space", False),
])
def test_what_reads_as_a_hub_id(path, hub):
    assert is_hub_id(path) is hub


def test_neither_a_path_nor_a_hub_id_keeps_no_such_file(tmp_path, monkeypatch):
    _use_cache(monkeypatch, tmp_path / "hf-cache")
    for path in ("no_such_model", str(tmp_path / "a" / "b"), "a/b/c"):
        with pytest.raises(ModelError) as e:
            resolve_source(path)
        msg = _one_line(e)
        assert f"actor_rollout_ref.model.path={path}: no such file or folder" in msg and "Hub id (org/name)" in msg

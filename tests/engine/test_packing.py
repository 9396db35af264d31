"""Padding-free forward: packed log-probs, entropies and critic values equal the padded
forward (``rlforge.roles.forward``) and each sequence run alone without padding; a
negative control shows the comparison fails when sequences can see each other."""

from __future__ import annotations

import pytest
import torch

from rlforge.batch import Batch
from rlforge.engine.packing import pack, packed_response_log_probs, packed_response_values
from rlforge.roles.forward import response_log_probs, response_values
from rlforge.rollout.base import assemble

EOS = 2
R = 7


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    from rlforge.models import load_causal_lm

    return load_causal_lm("preset:tiny", tiny_tokenizer, {"initializer_range": 0.2}, seed=1).eval()


@pytest.fixture(scope="module")
def batch(tiny_tokenizer):
    """5 rows: left-padded prompts of 1..6 tokens, responses with EOS at different places
    (one without EOS), so both paddings are exercised."""
    g = torch.Generator().manual_seed(0)
    pad = tiny_tokenizer.pad_token_id
    p_lens = [3, 6, 1, 5, 2]
    eos_at = [0, 6, 2, None, 4]
    width = max(p_lens)
    ids = torch.full((5, width), pad, dtype=torch.long)
    mask = torch.zeros((5, width), dtype=torch.long)
    raw = torch.randint(100, 1000, (5, R), generator=g)
    for i, (n, e) in enumerate(zip(p_lens, eos_at, strict=True)):
        ids[i, width - n:] = torch.randint(100, 1000, (n,), generator=g)
        mask[i, width - n:] = 1
        if e is not None:
            raw[i, e] = EOS
    prompts = Batch.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})
    b = assemble(prompts, raw, [EOS], pad)
    assert b["response_mask"].sum(1).tolist() == [1, 7, 3, 7, 5]
    return b


def _alone_log_probs(model, b: Batch, temperature: float) -> list[torch.Tensor]:
    """Independent reference: each sequence's valid tokens run alone, no padding, no mask."""
    out = []
    resp_mask = b["response_mask"].bool()
    for i in range(len(b)):
        toks = b["input_ids"][i][b["attention_mask"][i].bool()]
        n_resp = int(resp_mask[i].sum())
        logits = model(input_ids=toks[None], use_cache=False).logits[0].float() / temperature
        lp = torch.log_softmax(logits[:-1], -1).gather(-1, toks[1:, None])[:, 0]
        out.append(lp[-n_resp:])
    return out


def test_pack_removes_all_padding(batch):
    p = pack(batch)
    n = int(batch["attention_mask"].sum())
    assert p.input_ids.shape == (1, n) and p.position_ids.shape == (1, n)
    # exactly the valid tokens, row after row (pad id == EOS id here, so compare tokens)
    expected = [int(t) for i in range(len(batch)) for t, m in zip(batch["input_ids"][i], batch["attention_mask"][i], strict=True) if m]
    assert p.input_ids[0].tolist() == expected
    lens = batch["attention_mask"].sum(-1)
    assert p.cu_seqlens.tolist() == [0] + torch.cumsum(lens, 0).tolist()
    # positions restart at 0 at every sequence start
    assert (p.position_ids[0, p.cu_seqlens[:-1].long()] == 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_log_probs_equal_padded(model, batch, temperature):
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        ref_lp, ref_ent = response_log_probs(model, batch, temperature, with_entropy=True)
        lp, ent = packed_response_log_probs(model, batch, temperature, with_entropy=True)
        alone = _alone_log_probs(model, batch, temperature)
    assert lp.shape == ref_lp.shape and lp.dtype == torch.float32
    assert ent is not None and ent.shape == ref_ent.shape
    torch.testing.assert_close(lp[mask], ref_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[mask], ref_ent[mask], atol=1e-5, rtol=0)
    for i, ref in enumerate(alone):
        torch.testing.assert_close(lp[i][mask[i]], ref, atol=1e-5, rtol=0)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    # the log-probs are informative (a broken gather would not match by accident)
    assert ref_lp[mask].std() > 0.1


def test_without_entropy_returns_none(model, batch):
    with torch.no_grad():
        _, ent = packed_response_log_probs(model, batch, 1.0, with_entropy=False)
    assert ent is None


def test_negative_control_cross_sequence_attention_differs(model, batch):
    """If the packed row were attended as one sequence (plain causal mask over all
    tokens), the log-probs would differ: the equality above is not vacuous."""
    p = pack(batch)
    with torch.no_grad():
        ref_lp, _ = response_log_probs(model, batch, 1.0, with_entropy=False)
        flat_pos = torch.arange(p.input_ids.shape[1])[None]  # no resets: one long sequence
        logits = model(input_ids=p.input_ids, position_ids=flat_pos, use_cache=False).logits[0]
    last_row_first = int(p.cu_seqlens[-2]) + int(batch["attention_mask"][-1].sum()) - int(batch["response_mask"][-1].sum()) - 1
    lp_wrong = torch.log_softmax(logits[last_row_first], -1)[batch["responses"][-1, 0]]
    assert abs(float(lp_wrong) - float(ref_lp[-1, 0])) > 1e-3


def test_packed_values_equal_padded(tiny_tokenizer, batch):
    from rlforge.models import load_value_model

    critic = load_value_model("preset:tiny", tiny_tokenizer, {"initializer_range": 0.2}, seed=2).eval()
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        ref = response_values(critic, batch)
        got = packed_response_values(critic, batch)
    assert got.shape == ref.shape and got.dtype == torch.float32
    torch.testing.assert_close(got[mask], ref[mask], atol=1e-5, rtol=0)
    assert ref[mask].std() > 1e-3
    assert (got[~mask] == 0).all()


def test_bad_position_ids_rejected(batch):
    b = batch.select(slice(0, len(batch)))
    b["position_ids"] = b["position_ids"] + b["attention_mask"]  # valid positions start at 1
    with pytest.raises(ValueError, match="position_ids"):
        pack(b)


def test_packed_log_probs_equal_padded_eager_attention(tiny_tokenizer, batch):
    """The same mechanism holds for the ``eager`` attention implementation."""
    from rlforge.models import load_causal_lm

    eager = load_causal_lm("preset:tiny", tiny_tokenizer, {"initializer_range": 0.2}, seed=1).eval()
    eager.set_attn_implementation("eager")
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        ref_lp, _ = response_log_probs(eager, batch, 1.0, with_entropy=False)
        lp, _ = packed_response_log_probs(eager, batch, 1.0, with_entropy=False)
    torch.testing.assert_close(lp[mask], ref_lp[mask], atol=1e-5, rtol=0)

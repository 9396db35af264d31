"""The host-computed packing plan (:mod:`rlforge.engine.staging`): with it, the padding-free and the
padded chunked-head forwards give the same log-probs, entropies and gradients as without it (the
plan only moves index work to the host); it follows ``Batch.to`` and is dropped by ``Batch.select``;
bad positions are still refused; and the metrics read-back keeps every value and order."""

from __future__ import annotations

import pytest
import torch
from helpers import left_padded_batch

from rlforge.batch import Batch
from rlforge.engine.packing import PACK_PLAN, pack, packed_response_log_probs, plan_of, with_pack_plan
from rlforge.engine.staging import metrics_to_floats, stage
from rlforge.roles.forward import response_log_probs

EOS = 2
R = 7


@pytest.fixture(scope="module")
def model(spread_tiny_model):
    return spread_tiny_model


@pytest.fixture(scope="module")
def batch(tiny_tokenizer):
    """4 rows: left-padded prompts of 3, 6, 1, 5 tokens; responses with EOS at 0, 6, 2 and none."""
    return left_padded_batch(tiny_tokenizer.pad_token_id, EOS, [3, 6, 1, 5], [0, 6, 2, None], R, seed=3)


def _grads(model, fn, mb):
    """Log-probs, entropies and the parameter gradients of their sum over real response tokens."""
    model.zero_grad(set_to_none=True)
    logp, ent = fn(model, mb, 0.7, True, 3)
    mask = mb["response_mask"].float()
    ((logp * mask).sum() + 0.5 * (ent * mask).sum()).backward()
    return logp.detach(), ent.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("fn", [packed_response_log_probs, response_log_probs], ids=["packed", "padded"])
def test_plan_gives_the_same_values_and_gradients(model, batch, fn):
    """With the host's plan and with one made in the call, the chunked head gives the same values
    and gradients, and both match the independent reference: the padded forward's full logits."""
    planned = with_pack_plan(batch)
    assert plan_of(planned) is not None and plan_of(batch) is None
    full_lp, full_ent, full_g = _grads(model, lambda m, mb, t, e, c: response_log_probs(m, mb, t, e, 0), batch)
    ref_lp, ref_ent, ref_g = _grads(model, fn, batch)
    lp, ent, g = _grads(model, fn, planned)
    mask = batch["response_mask"].bool()
    assert full_lp[mask].std() > 1e-3  # the comparison can fail
    torch.testing.assert_close(lp, ref_lp, atol=0, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=0, rtol=0)
    torch.testing.assert_close(lp[mask], full_lp[mask], atol=1e-5, rtol=1e-5)  # the reference does not zero padding
    torch.testing.assert_close(ent[mask], full_ent[mask], atol=1e-5, rtol=1e-5)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    assert g.keys() == ref_g.keys() == full_g.keys() and len(g) > 3
    for k in g:
        torch.testing.assert_close(g[k], ref_g[k], atol=1e-6, rtol=1e-5)
        # another attention path (padded, masked) rounds differently: compare the whole tensor
        assert (g[k] - full_g[k]).norm() <= 1e-4 * full_g[k].norm() + 1e-7, k


def test_pack_matches_boolean_mask_packing(batch):
    """pack() with the host's plan and with one made in the call equals packing by boolean mask."""
    valid = batch["attention_mask"].bool()
    lens = valid.sum(1)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
    assert lens.min() < lens.max()  # rows of different lengths: the packing can be wrong
    for packed in (pack(batch), pack(with_pack_plan(batch))):
        assert torch.equal(packed.input_ids, batch["input_ids"][valid].unsqueeze(0))
        assert torch.equal(packed.position_ids, batch["position_ids"][valid].unsqueeze(0))
        assert torch.equal(packed.cu_seqlens, cu) and packed.max_len == int(lens.max())
        assert torch.equal(packed.packed_index[valid], torch.arange(int(lens.sum())))


def test_plan_moves_with_to_and_is_dropped_by_select(batch):
    planned = with_pack_plan(batch)
    moved = planned.to("cpu")
    assert plan_of(moved) is not None
    assert PACK_PLAN not in planned.select([0, 2]).meta  # a row subset must not keep the old plan
    assert PACK_PLAN not in planned.split(2)[0].meta
    staged = stage([batch.select([0, 1]), batch.select([2, 3])], torch.device("cpu"))
    assert all(plan_of(mb) is not None and plan_of(mb).shape == tuple(mb["attention_mask"].shape) for mb in staged)


def test_plan_refuses_bad_positions(batch):
    b = batch.select(slice(0, len(batch)))
    b["position_ids"] = b["position_ids"] + b["attention_mask"]
    with pytest.raises(ValueError, match="position_ids"):
        pack(with_pack_plan(b))


def test_stale_plan_for_another_shape_is_ignored(batch):
    planned = with_pack_plan(batch.select([0, 1]))
    other = Batch(batch.tensors, batch.non_tensor, dict(planned.meta))  # 4 rows, a 2-row plan
    assert plan_of(other) is None
    torch.testing.assert_close(pack(other).input_ids, pack(batch).input_ids)


def test_metrics_to_floats_keeps_values_and_order():
    per = [{"a_loss": torch.tensor(0.25), "b": 3, "c": torch.tensor([2.5])}, {"b": 1.5, "a_loss": torch.tensor(-1.0)}]
    out = metrics_to_floats(per)
    assert out == [{"a_loss": 0.25, "b": 3.0, "c": 2.5}, {"b": 1.5, "a_loss": -1.0}]
    assert [list(o) for o in out] == [list(p) for p in per]
    assert all(type(v) is float for o in out for v in o.values())
    with pytest.raises(ValueError, match="'v'"):
        metrics_to_floats([{"v": torch.ones(2)}])

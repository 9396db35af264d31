"""The shared-prompt packed layout (``actor.use_prefix_grouper``, :func:`rlforge.engine.packing.make_pack_plan`).

Rows with the same prompt are packed with that prompt once and every member's response after it;
each response attends to the one prompt copy.  References: the layout written out by hand, and the
padded ``sdpa`` forward of the same rows (log-probs, entropies and parameter gradients), which
computes every prompt once per row.  A negative control (keys of the prompt dropped) must change
the log-probs, so the comparison can fail.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rlforge.batch import Batch
from rlforge.engine.packing import PACK_PLAN, make_pack_plan, pack, packed_response_log_probs, with_pack_plan
from rlforge.roles.forward import response_log_probs
from rlforge.rollout.base import assemble

EOS = 2
R = 9
OVERRIDE = {"initializer_range": 0.2}


def grouped_batch(pad: int, groups: list[tuple[int, list[int | None]]], resp_len: int = R, seed: int = 0) -> Batch:
    """Left-padded prompts, one random prompt of ``p`` tokens per group shared by its members, and
    random responses with EOS at each member's ``eos_at`` (None: no EOS), assembled as a rollout would."""
    g = torch.Generator().manual_seed(seed)
    p_lens = [p for p, members in groups for _ in members]
    n, width = len(p_lens), max(p_lens)
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    raw = torch.randint(100, 1000, (n, resp_len), generator=g)
    i = 0
    for p, members in groups:
        prompt = torch.randint(100, 1000, (p,), generator=g)
        for e in members:
            ids[i, width - p:] = prompt
            mask[i, width - p:] = 1
            if e is not None:
                raw[i, e] = EOS
            i += 1
    prompts = Batch.from_dict({"input_ids": ids, "attention_mask": mask,
                               "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})
    return assemble(prompts, raw, [EOS], pad)


@pytest.fixture(scope="module")
def batch(tiny_tokenizer):
    # two groups of 3 and 2 rows, and one row alone; responses of different lengths
    return grouped_batch(tiny_tokenizer.pad_token_id, [(5, [2, None, 0]), (3, [6, 4]), (7, [3])])


@pytest.fixture(scope="module")
def sdpa_model(tiny_tokenizer):
    from rlforge.models import load_causal_lm

    return load_causal_lm("preset:tiny", tiny_tokenizer, OVERRIDE, seed=1).eval()


@pytest.fixture(scope="module")
def varlen_model(tiny_tokenizer):
    from rlforge.models import load_causal_lm

    return load_causal_lm("preset:tiny", tiny_tokenizer, {**OVERRIDE, "attn_implementation": "rlforge_varlen"},
                          seed=1).eval()


def test_layout_by_hand(tiny_tokenizer):
    """Two rows share a 2-token prompt (responses of 3 and 1 tokens), a third has its own."""
    mb = grouped_batch(tiny_tokenizer.pad_token_id, [(2, [2, 0]), (1, [1])], resp_len=4)
    plan = make_pack_plan(mb, share_prompts=True)
    assert plan.shared
    # query segments: prompt A (2), response 0 (3), response 1 (1), prompt B (1), response 2 (2)
    assert plan.cu_seqlens.tolist() == [0, 2, 5, 6, 7, 9] and plan.max_len == 3
    # keys: A; A + r0; A + r1; B; B + r2
    assert plan.cu_seqlens_k.tolist() == [0, 2, 7, 10, 11, 14] and plan.max_len_k == 5
    assert plan.kv_index.tolist() == [0, 1, 0, 1, 2, 3, 4, 0, 1, 5, 6, 6, 7, 8]
    # work not computed: one copy of prompt A (2 tokens, 2² of the attention count); B is alone
    assert plan.saved == (2, 4)
    assert make_pack_plan(mb).saved == (0, 0)
    width = mb["input_ids"].shape[1] - 4  # prompt columns
    assert plan.packed_index[1, width - 2:width].tolist() == [0, 1]  # row 1's prompt is row 0's copy
    assert plan.flat.numel() == 9  # against 2 + 3 + 2 + 1 + 1 + 2 = 11 unshared
    # the first response token of each row is predicted from its group's last prompt position
    first = [plan.response_src[plan.keep_flat == b * 4].item() for b in range(3)]
    assert first == [1, 1, 6]
    assert plan.positions_ok


def test_distinct_prompts_keep_the_plain_layout(tiny_tokenizer):
    mb = grouped_batch(tiny_tokenizer.pad_token_id, [(3, [1]), (4, [2]), (2, [None])])
    plan = make_pack_plan(mb, share_prompts=True)
    assert not plan.shared and plan.kv_index is None
    assert plan.cu_seqlens.tolist() == make_pack_plan(mb).cu_seqlens.tolist()


@pytest.mark.parametrize("chunk_size", [0, 4])
def test_shared_log_probs_equal_padded_sdpa(sdpa_model, varlen_model, batch, chunk_size):
    mask = batch["response_mask"].bool()
    shared = with_pack_plan(batch, share_prompts=True)
    assert shared.meta[PACK_PLAN].shared
    assert pack(shared).input_ids.shape[1] < int(batch["attention_mask"].sum())  # fewer tokens run
    with torch.no_grad():
        ref_lp, ref_ent = response_log_probs(sdpa_model, batch, 0.8, with_entropy=True)
        lp, ent = packed_response_log_probs(varlen_model, shared, 0.8, with_entropy=True, chunk_size=chunk_size)
    assert ent is not None
    torch.testing.assert_close(lp[mask], ref_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[mask], ref_ent[mask], atol=1e-5, rtol=0)
    assert (lp[~mask] == 0).all()
    assert ref_lp[mask].std() > 0.1  # informative log-probs


def test_shared_gradients_equal_padded_sdpa(sdpa_model, varlen_model, batch):
    """The prompt runs once, so its gradient is the sum of every member's: the same as padded rows."""
    mask = batch["response_mask"].bool()
    grads = []
    for model, mb, fn in ((sdpa_model, batch, response_log_probs),
                          (varlen_model, with_pack_plan(batch, share_prompts=True), packed_response_log_probs)):
        m = copy.deepcopy(model).train()
        lp, ent = fn(m, mb, 0.8, with_entropy=True)
        loss = -(lp * torch.linspace(-1.0, 2.0, lp.shape[1]))[mask].sum() - 0.1 * ent[mask].sum()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    ref, got = grads
    assert ref.keys() == got.keys()
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], atol=2e-5, rtol=1e-4, msg=name)


def test_negative_control_without_the_prompt_keys(varlen_model, batch):
    """Keys that skip the prompt (each response sees only itself) must change the log-probs."""
    from dataclasses import replace

    mask = batch["response_mask"].bool()
    shared = with_pack_plan(batch, share_prompts=True)
    plan = shared.meta[PACK_PLAN]
    q = plan.cu_seqlens.tolist()
    k = plan.cu_seqlens_k.tolist()
    kv, cu_k = [], [0]
    for i in range(len(q) - 1):
        own = plan.kv_index[k[i + 1] - (q[i + 1] - q[i]):k[i + 1]]  # the segment's own tokens only
        kv.append(own)
        cu_k.append(cu_k[-1] + own.numel())
    broken = replace(plan, kv_index=torch.cat(kv), cu_seqlens_k=torch.tensor(cu_k, dtype=torch.int32),
                     max_len_k=plan.max_len)
    bad = Batch(batch.tensors, batch.non_tensor, {**batch.meta, PACK_PLAN: broken})
    with torch.no_grad():
        good_lp, _ = packed_response_log_probs(varlen_model, shared, 1.0, with_entropy=False)
        bad_lp, _ = packed_response_log_probs(varlen_model, bad, 1.0, with_entropy=False)
    assert (good_lp[mask] - bad_lp[mask]).abs().max() > 1e-2


def test_shared_layout_needs_the_varlen_attention(sdpa_model, batch):
    with pytest.raises(ValueError, match="rlforge_varlen"):
        packed_response_log_probs(sdpa_model, with_pack_plan(batch, share_prompts=True), 1.0, with_entropy=False)


def test_token_budget_keeps_a_prompts_rows_together(batch):
    """Row lengths 8, 14, 6 (prompt A, 5 tokens), 10, 8 (prompt B, 3), 11 (prompt C, 7), written out by hand."""
    from rlforge.engine.dynamic_batch import prompt_group_items, split_by_token_budget

    assert batch["attention_mask"].sum(-1).tolist() == [8, 14, 6, 10, 8, 11]
    assert prompt_group_items(batch, 64) == ([[0, 1, 2], [3, 4], [5]], [5 + 3 + 9 + 1, 3 + 7 + 5, 11])
    # a budget of 16 cuts prompt A's rows into chunks that fit, each counting the prompt once
    assert prompt_group_items(batch, 16) == ([[0], [1, 2], [3, 4], [5]], [8, 5 + 9 + 1, 15, 11])
    parts, order = split_by_token_budget(batch, 16, "ppo_max_token_len_per_gpu", share_prompts=True)
    assert sorted(order) == list(range(6))
    run = [make_pack_plan(part, share_prompts=True).flat.numel() for part in parts]
    assert max(run) <= 16 and sum(run) == 8 + 15 + 15 + 11  # the tokens the forwards run (57 unshared)
    together = {tuple(sorted(int(x) for x in p["attention_mask"].sum(-1).tolist())) for p in parts}
    assert (6, 14) in together and (8, 10) in together  # rows 1, 2 and rows 3, 4 share a micro-batch


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@cuda
@pytest.mark.cuda
def test_cuda_shared_layout_matches_the_sdpa_reference(varlen_model, batch):
    """On the GPU the shared layout runs through ``varlen_attn`` with key segments longer than their
    query segments, which must align the causal diagonal bottom-right as the CPU reference does:
    bf16 attention with the prompt shared against the same layout through the float32 SDPA loop,
    forward and backward."""
    from rlforge.engine import varlen

    if not varlen.varlen_available(torch.device("cuda")):
        pytest.skip("this torch/GPU has no varlen_attn")
    plan = make_pack_plan(batch, share_prompts=True)
    n, hq, hkv, d = plan.flat.numel(), 4, 2, 64
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(n, h, d, generator=g, device="cuda", requires_grad=True) for h in (hq, hkv, hkv))
    kv = plan.kv_index.cuda()
    cu_q, cu_k = plan.cu_seqlens.cuda(), plan.cu_seqlens_k.cuda()
    fn, params = varlen._varlen_attn()
    got = varlen.call_varlen_attn(fn, params, q.bfloat16(), k.bfloat16().index_select(0, kv),
                                  v.bfloat16().index_select(0, kv), cu_q, cu_k, plan.max_len, plan.max_len_k, None, None)
    ref = varlen.sdpa_varlen_reference(q.double(), k.double().index_select(0, kv), v.double().index_select(0, kv),
                                       cu_q, cu_k)
    torch.testing.assert_close(got.double(), ref, atol=2e-2, rtol=0)
    grad = torch.cos(torch.arange(got.numel(), device="cuda", dtype=torch.float32)).view_as(got)
    g_got = torch.autograd.grad(got.float(), (q, k, v), grad)
    g_ref = torch.autograd.grad(ref, (q, k, v), grad.double())
    for a, b in zip(g_got, g_ref, strict=True):
        torch.testing.assert_close(a.double(), b.double(), atol=5e-2, rtol=0)


def test_more_parts_than_groups_splits_the_groups(batch, monkeypatch):
    """When another data-parallel rank needs more micro-batches than this rank has prompt chunks, the
    rows are split one by one (the count must match across ranks) instead of failing."""
    from rlforge.engine import dynamic_batch

    monkeypatch.setattr(dynamic_batch, "sync_num_micro_batches", lambda n, group=None: max(n, 5))
    parts, order = dynamic_batch.split_by_token_budget(batch, 64, "ppo_max_token_len_per_gpu", share_prompts=True)
    assert len(parts) == 5 and sorted(order) == list(range(6))


def test_saved_work_of_groups(batch):
    """Groups of 3 rows (5-token prompt) and 2 rows (3 tokens), one row alone: 2 + 1 copies of a
    prompt not computed, summed over micro-batches by ``staging.saved_work``; the FLOPs those copies
    take in ``hfu``, by hand for a small config."""
    from types import SimpleNamespace

    from rlforge.engine.staging import saved_work, stage
    from rlforge.perf.flops import shared_prompt_flops

    assert make_pack_plan(batch, share_prompts=True).saved == (2 * 5 + 3, 2 * 25 + 9)
    halves = [batch.select([0, 1, 2]), batch.select([3, 4, 5])]
    assert saved_work(stage(halves, torch.device("cpu"), share_prompts=True)) == (10 + 3, 50 + 9)
    assert saved_work(stage(halves, torch.device("cpu"))) == (0, 0)
    cfg = SimpleNamespace(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                          intermediate_size=16, num_hidden_layers=3, vocab_size=50)
    layer_params = 3 * (8 * 4 * (2 + 2) + 2 * 4 * 8 + 3 * 8 * 16)  # QKV, O, gate/up/down
    per_pass = 2 * layer_params * 13 + 4 * 3 * 2 * 4 * 59
    assert shared_prompt_flops(cfg, 13, 59) == 3 * per_pass
    assert shared_prompt_flops(cfg, 13, 59, recompute=True) == 4 * per_pass


def test_another_ranks_count_splits_groups_not_rows(tiny_tokenizer, monkeypatch):
    """One group of 4 rows (4-token prompt, 2-token responses: 6 tokens a row, 8 a shared pair)
    under a budget of 10: this rank alone needs 2 chunks ([0, 1, 2] and [3]).  When another rank
    needs 3 micro-batches, the chunks are cut to 3 ([3], [0], [1, 2]), keeping the pair shared;
    falling back to single rows (6 + 6 > 10 unshared) would need 4 and share nothing."""
    from rlforge.engine import dynamic_batch
    from rlforge.engine.dynamic_batch import split_by_token_budget
    from rlforge.engine.staging import saved_work, stage

    mb = grouped_batch(tiny_tokenizer.pad_token_id, [(4, [1, 1, 1, 1])], resp_len=4)
    assert [int(x) for x in mb["attention_mask"].sum(-1)] == [6, 6, 6, 6]
    assert len(split_by_token_budget(mb, 10, "k", share_prompts=True)[0]) == 2
    monkeypatch.setattr(dynamic_batch, "sync_num_micro_batches", lambda m, group=None: max(m, 3))
    parts, order = split_by_token_budget(mb, 10, "k", share_prompts=True)
    assert len(parts) == 3 and sorted(order) == [0, 1, 2, 3]
    assert sorted(len(p) for p in parts) == [1, 1, 2]
    assert saved_work(stage(parts, torch.device("cpu"), share_prompts=True)) == (4, 16)

"""Ranks' rollout batches differ in width (each pads to its own longest prompt and response);
``spmd.pad_to_widths`` makes them concatenable without moving any token."""

from __future__ import annotations

import torch

from rlforge.batch import Batch
from rlforge.roles.forward import response_log_probs
from rlforge.rollout.base import assemble
from rlforge.trainer.spmd import pad_to_widths


def _rollout_batch(prompt_lens: list[int], resp: list[list[int]], width_p: int, eos: int) -> Batch:
    g = torch.Generator().manual_seed(len(prompt_lens) * 7 + width_p)
    ids = torch.zeros((len(prompt_lens), width_p), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(prompt_lens):
        ids[i, width_p - n:] = torch.randint(3, 50, (n,), generator=g)
        mask[i, width_p - n:] = 1
    prompts = Batch.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})
    width_r = max(len(r) for r in resp)
    responses = torch.zeros((len(resp), width_r), dtype=torch.long)
    for i, r in enumerate(resp):
        responses[i, : len(r)] = torch.tensor(r)
    out = assemble(prompts, responses, [eos], 0)
    out["token_level_scores"] = torch.arange(out["responses"].numel(), dtype=torch.float32).view_as(out["responses"])
    return out


def test_padded_rank_batches_concatenate_and_keep_every_token(tiny_model):
    eos = 2
    a = _rollout_batch([3, 5], [[7, 8, eos], [9, eos]], width_p=5, eos=eos)  # prompt width 5, response width 3
    b = _rollout_batch([7], [[4, 5, 6, 7, 8, 9]], width_p=7, eos=eos)  # prompt width 7, response width 6
    pa, pb = pad_to_widths(a, 7, 6), pad_to_widths(b, 7, 6)
    full = Batch.concat([pa, pb])
    assert full["input_ids"].shape == (3, 13) and full["responses"].shape == (3, 6)
    for before, after in ((a, pa), (b, pb)):
        r = before["responses"].shape[1]
        assert torch.equal(after["responses"][:, :r], before["responses"])
        assert torch.equal(after["response_mask"][:, :r], before["response_mask"])
        assert after["response_mask"][:, r:].sum() == 0
        assert torch.equal(after["token_level_scores"][:, :r], before["token_level_scores"])
        # the valid tokens of each row, in order, are unchanged
        for i in range(len(before)):
            m0, m1 = before["attention_mask"][i].bool(), after["attention_mask"][i].bool()
            assert torch.equal(before["input_ids"][i][m0], after["input_ids"][i][m1])
            assert torch.equal(before["position_ids"][i][m0], after["position_ids"][i][m1])
        # and the model scores the responses the same (alignment of prompt and response is right)
        with torch.no_grad():
            lp0, _ = response_log_probs(tiny_model, before, 1.0, with_entropy=False)
            lp1, _ = response_log_probs(tiny_model, after, 1.0, with_entropy=False)
        mask = before["response_mask"].bool()
        torch.testing.assert_close(lp1[:, :r][mask], lp0[mask], atol=1e-5, rtol=1e-5)

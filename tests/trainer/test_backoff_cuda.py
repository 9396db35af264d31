"""Online back-off on a GPU (CUDA only; skipped without one): a real ``torch.OutOfMemoryError`` from
the CUDA caching allocator, raised inside the FSDP2 actor's forward (bf16 autocast, NCCL one-rank
group), is answered by halving the budget, and the redone update equals an engine that used the
halved budget from the start."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_backoff as tb  # noqa: E402


def test_real_cuda_oom_is_backed_off_and_redone():
    dev = torch.device("cuda", 0)
    cfg = tb.tuned_config(f"{tb.A}.use_dynamic_bsz=true")
    actor, batch = tb.make_actor(budget=64, device=dev)
    log, lines = tb.watch(cfg, actor)
    inner, failed = actor.log_probs_fn, []

    def fn(module, mb, temperature, with_entropy):
        logp, ent = inner(module, mb, temperature, with_entropy)
        if torch.is_grad_enabled() and int(mb["attention_mask"].sum()) > 30:
            failed.append(int(mb["attention_mask"].sum()))
            torch.empty(1 << 45, dtype=torch.uint8, device=dev)  # 32 TiB: the allocator's own error
        return logp, ent

    actor.log_probs_fn = fn
    actor.update(batch, tb.TEMP)
    assert failed == [56] and actor.train_budget.max_token_len == 32 and len(lines) == 1
    got = {k: v.cpu() for k, v in tb.weights(actor).items()}
    ref_actor, ref_batch = tb.make_actor(budget=32, device=dev)
    ref_actor.update(ref_batch, tb.TEMP)
    want = {k: v.cpu() for k, v in tb.weights(ref_actor).items()}
    tb.assert_same(got, want, exact=False)
    exact = all(torch.equal(got[k], want[k]) for k in got)
    print(f"bit-exact on {torch.cuda.get_device_name(0)}: {exact}")

"""GPU-only parts of the native engine: the Triton paged-attention kernel against the torch
reference, and CUDA-graph decoding against eager decoding.  Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

from rlforge.batch import Batch  # noqa: E402
from rlforge.rollout import SamplingParams  # noqa: E402
from rlforge.rollout.native import NativeRollout  # noqa: E402
from rlforge.rollout.native.attention import decode_attention_torch  # noqa: E402

CUDA = torch.device("cuda")


@pytest.mark.parametrize("heads,kv_heads,d,bs", [(14, 2, 64, 16), (28, 4, 128, 16), (8, 8, 64, 32)])
def test_triton_kernel_matches_torch_reference(heads, kv_heads, d, bs):
    from rlforge.rollout.native.triton_attention import paged_decode_attention

    g = torch.Generator(device=CUDA).manual_seed(0)
    nblocks = 300
    kc = torch.randn(nblocks, bs, kv_heads, d, generator=g, device=CUDA, dtype=torch.bfloat16)
    vc = torch.randn(nblocks, bs, kv_heads, d, generator=g, device=CUDA, dtype=torch.bfloat16)
    ctx = torch.tensor([0, 1, 17, 64, 65, 700, 1000, 33], dtype=torch.int32, device=CUDA)
    width = -(-1000 // bs)
    bt = torch.randint(0, nblocks, (len(ctx), width), generator=g, device=CUDA, dtype=torch.int32)
    q = torch.randn(len(ctx), heads, d, generator=g, device=CUDA, dtype=torch.bfloat16)
    got = paged_decode_attention(q, kc, vc, bt, ctx, d ** -0.5)
    want = decode_attention_torch(q, kc, vc, bt, ctx, d ** -0.5)
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(got[0], torch.zeros_like(got[0]))


@pytest.fixture(scope="module")
def model():
    from transformers import AutoModelForCausalLM

    from rlforge.models.presets import PRESETS

    cls, kw = PRESETS["qwen2.5-0.5b"]
    torch.manual_seed(0)
    with torch.device(CUDA):
        m = AutoModelForCausalLM.from_config(
            cls(**{**kw, "num_hidden_layers": 4, "initializer_range": 0.1}), dtype=torch.bfloat16)
    return m.eval()


def _prompts(n: int, vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    lens = torch.randint(5, 40, (n,), generator=g)
    width = int(lens.max())
    ids = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n_i in enumerate(lens.tolist()):
        ids[i, width - n_i:] = torch.randint(100, vocab - 100, (n_i,), generator=g)
        mask[i, width - n_i:] = 1
    return Batch.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})


def test_cuda_graphs_give_the_eager_tokens(model):
    """Greedy decoding with graphs (padded buckets, bursts) equals eager decoding with the same
    kernels, token for token; and the torch attention path agrees on the first decode step."""
    batch = _prompts(37, model.config.vocab_size)
    greedy = SamplingParams(do_sample=False, max_new_tokens=40)
    kw = dict(progress=False, max_num_seqs=32, cudagraph_capture_sizes=[1, 8, 16, 32])
    graph = NativeRollout(model, [], 0, CUDA, **kw).generate(batch, greedy)
    eager = NativeRollout(model, [], 0, CUDA, enforce_eager=True, **kw).generate(batch, greedy)
    assert torch.equal(graph["responses"], eager["responses"])
    torch_attn = NativeRollout(model, [], 0, CUDA, attention="torch", **kw).generate(batch, greedy)
    # bf16 rounding differs between the kernels, so rows may diverge later; the first decoded
    # token (the second response token) reads the cache once and must agree almost everywhere
    agree = (torch_attn["responses"][:, 1] == graph["responses"][:, 1]).float().mean().item()
    assert agree > 0.9, agree


def test_overlapped_bursts_give_the_serial_tokens(model, monkeypatch):
    """Under CUDA graphs, launching each burst before the previous one is read (its tokens copied
    behind an event) gives the tokens of reading every burst first: rows with their own lengths
    (the long-tail shape), more rows than ``max_num_seqs``, and bursts of 4 steps."""
    import rlforge.rollout.native.engine as engine_module

    batch = _prompts(37, model.config.vocab_size)
    lengths = [5 + (7 * i) % 36 for i in range(37)]
    orig = engine_module.Sequence
    greedy = SamplingParams(do_sample=False, max_new_tokens=40)
    runs = []
    for overlap in (False, True):
        made: list = []

        def make(i, ids, n, made=made):
            made.append(orig(i, ids, lengths[i]))
            return made[-1]

        monkeypatch.setattr(engine_module, "Sequence", make)
        eng = NativeRollout(model, [], 0, CUDA, progress=False, max_num_seqs=32, max_decode_burst=4,
                            cudagraph_capture_sizes=[1, 8, 16, 32], overlap_steps=overlap)
        eng.generate(batch, greedy)
        runs.append(({q.seq_id: q.output_ids for q in made}, eng.metrics()["rollout/overlapped_bursts"]))
    (serial, n0), (over, n1) = runs
    assert n0 == 0 and n1 > 0
    assert [len(over[i]) for i in range(37)] == lengths
    assert over == serial


def test_graphs_see_in_place_weight_updates(model):
    batch = _prompts(8, model.config.vocab_size)
    greedy = SamplingParams(do_sample=False, max_new_tokens=12)
    eng = NativeRollout(model, [], 0, CUDA, progress=False, free_cache_engine=False, max_num_seqs=8)
    before = eng.generate(batch, greedy)
    w = model.model.layers[0].mlp.down_proj.weight
    saved = w.detach().clone()
    with torch.no_grad():
        w.mul_(-3.0)
    try:
        after = eng.generate(batch, greedy)  # the same graphs, replayed on the new weights
        fresh = NativeRollout(model, [], 0, CUDA, progress=False, enforce_eager=True,
                              max_num_seqs=8).generate(batch, greedy)
    finally:
        with torch.no_grad():
            w.copy_(saved)
    assert not torch.equal(before["responses"], after["responses"])
    assert torch.equal(after["responses"], fresh["responses"])


def _allocated_after_generations(model, n: int) -> list[int]:
    batch = _prompts(8, model.config.vocab_size)
    greedy = SamplingParams(do_sample=False, max_new_tokens=6)
    eng = NativeRollout(model, [], 0, CUDA, progress=False, max_num_seqs=8)  # frees cache and graphs each call
    out = []
    for _ in range(n):
        eng.generate(batch, greedy)
        torch.cuda.synchronize()
        out.append(torch.cuda.memory_allocated())
    return out


def test_repeated_generations_do_not_grow_allocated_memory(model, monkeypatch):
    """Each generation rebuilds its CUDA graphs; their warm-up stream is reused, so no cuBLAS
    workspace (kept by PyTorch per stream, never freed) piles up.  Negative control: a new
    stream per generation grows allocated memory every call."""
    import rlforge.rollout.native.cuda_graph as cg

    mib = 2**20
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", lambda: None)  # start from no workspaces
    clear()
    steady = _allocated_after_generations(model, 4)
    assert abs(steady[-1] - steady[1]) < mib, steady  # the first call may allocate the one workspace
    monkeypatch.setattr(cg, "warmup_stream", lambda dev: torch.cuda.Stream(dev))  # the next pooled stream
    clear()
    leaky = _allocated_after_generations(model, 3)
    assert leaky[1] - leaky[0] > 2 * mib and leaky[2] - leaky[1] > 2 * mib, leaky


def test_fused_triton_sampler_against_softmax():
    """The one-pass Triton sampler: greedy = argmax, log-probs = log_softmax(x / T) at the
    drawn token, draws follow softmax(x / T) (chi-square over 200k draws), NaN rows flagged."""
    from rlforge.rollout.native.triton_sampler import fused_sample

    g = torch.Generator(device=CUDA).manual_seed(0)
    logits = (torch.randn(64, 151936, generator=g, device=CUDA) * 3).to(torch.bfloat16)
    tok, lp, ok = fused_sample(logits, 1.0, True, None, True)
    assert bool(ok) and torch.equal(tok, logits.float().argmax(-1))
    ref = logits.float().log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1)
    torch.testing.assert_close(lp, ref, atol=1e-4, rtol=1e-4)

    vocab, temp = 40, 0.7
    row = (torch.randn(1, vocab, generator=g, device=CUDA) * 2).to(torch.bfloat16)
    rows = row.expand(200_000, vocab).contiguous()
    tok, lp, ok = fused_sample(rows, temp, False, g, True)
    p = (row[0].float() / temp).softmax(-1)
    counts = torch.bincount(tok, minlength=vocab).float()
    expected = p * rows.shape[0]
    keep = expected > 5
    stat = float(((counts[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    dof = int(keep.sum()) - 1
    bound = dof * (1 - 2 / (9 * dof) + 3.09 * (2 / (9 * dof)) ** 0.5) ** 3  # chi2 0.999 quantile (Wilson-Hilferty)
    assert stat < bound, (stat, bound)
    torch.testing.assert_close(lp, (rows.float() / temp).log_softmax(-1).gather(-1, tok[:, None]).squeeze(-1),
                               atol=1e-4, rtol=1e-4)
    bad = logits.clone()
    bad[5, 77] = float("nan")
    assert not bool(fused_sample(bad, 1.0, False, g, False)[2])

"""The persistent decode layer kernel (rlforge/rollout/native/triton_decode_layer.py) against the
eager layer-by-layer forward of the model runner (torch attention, no fused kernels).

Runs on CUDA (one launch per layer, grid-wide barriers), or on CPU under Triton's interpreter
(``TRITON_INTERPRET=1 pytest ...`` with the ``triton`` package; the five phases run as five
launches, float16 only: the interpreter's bfloat16 ``tl.dot`` is wrong); skipped otherwise."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

if torch.cuda.is_available():
    DEV = torch.device("cuda")
    DTYPES = [torch.bfloat16, torch.float16]
elif os.environ.get("TRITON_INTERPRET") == "1":
    DEV = torch.device("cpu")
    DTYPES = [torch.float16]
else:
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 to run the kernels on CPU", allow_module_level=True)

from transformers import LlamaConfig, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from rlforge.rollout.native import triton_decode_layer as tdl  # noqa: E402
from rlforge.rollout.native.kv_cache import KVCache  # noqa: E402
from rlforge.rollout.native.model_runner import ModelRunner, ModelSpec  # noqa: E402

BLOCK = 16


def _model(dtype: torch.dtype, hidden: int = 256, heads: int = 4, kv_heads: int = 2, layers: int = 2,
           bias: bool = True) -> torch.nn.Module:
    torch.manual_seed(0)
    if bias:
        cfg = Qwen2Config(hidden_size=hidden, intermediate_size=384, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=300, rms_norm_eps=1e-6,
                          tie_word_embeddings=True, initializer_range=0.1)
    else:
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=384, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=300, rms_norm_eps=1e-5,
                          tie_word_embeddings=True, initializer_range=0.1)
    from transformers import AutoModelForCausalLM

    model = (Qwen2ForCausalLM(cfg) if bias else AutoModelForCausalLM.from_config(cfg)).to(DEV, dtype).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.2)  # norms that are not all ones
            elif p.dim() == 1:
                p.normal_(0.0, 0.5)  # the Q/K/V biases
    return model


def _batch(spec: ModelSpec, ctxs: list[int], max_blocks: int, dtype: torch.dtype, seed: int = 1):
    """A random cache, shuffled block tables, and the new token's slot per row (context 0: a
    padding row writing slot 0, as a captured batch's padding writes its spare slot)."""
    g = torch.Generator().manual_seed(seed)
    b = len(ctxs)
    cache = KVCache.allocate(spec.num_layers, b * max_blocks + 1, BLOCK, spec.num_kv_heads, spec.head_dim, dtype, DEV)
    cache.data.copy_(torch.randn(cache.data.shape, generator=g))
    bt = (torch.randperm(b * max_blocks, generator=g).view(b, max_blocks) + 1).to(DEV, torch.int32)
    ctx = torch.tensor(ctxs, dtype=torch.int32, device=DEV)
    pos = (ctx.long() - 1).clamp_min(0)
    slot = torch.where(ctx > 0, bt.long().gather(1, (pos // BLOCK)[:, None])[:, 0] * BLOCK + pos % BLOCK, 0)
    ids = torch.randint(0, 300, (b,), generator=g).to(DEV)
    return cache, bt, ctx, pos, slot, ids


def _both(model, ctxs: list[int], max_blocks: int, dtype: torch.dtype, num_programs: int | None = None,
          **kernel_kw):
    """``(h, cache)`` of the eager body and of the layer kernel (``kernel_kw``: its options) on the
    same inputs and cache."""
    spec = ModelSpec.from_module(model)
    cache, bt, ctx, pos, slot, ids = _batch(spec, ctxs, max_blocks, dtype)
    out = []
    with torch.no_grad():
        for kernel in (False, True):
            c = KVCache(cache.data.clone())
            r = ModelRunner(model, c, "torch", fused=False, pack=True, layer_kernel=False)
            r.refresh_weights()
            if kernel:
                k = tdl.DecodeLayerKernel(r, num_programs=num_programs, **kernel_kw)
                h = F.embedding(ids, model.model.embed_tokens.weight)
                cos, sin = r._rope(pos, h.dtype)
                h = k(h, cos, sin, slot, bt, ctx)
            else:
                h = r._body(ids, pos, slot, lambda q, i, r=r: r._decode_attn(q, i, bt, ctx))
            out.append((h.float(), c.data.float()))
    return out, ctx


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal up to the rounding of a different summation order, a few compute-dtype ulps of the values."""
    torch.testing.assert_close(a, b, rtol=3e-2, atol=3e-2 * float(b.abs().max()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ctxs", [[1, 17, 1000, 129, 0], [300], [5] * 16, [700, 1, 1, 64, 1100, 333, 2, 900]])
@pytest.mark.parametrize("tile", [128, 256])
def test_layer_kernel_matches_eager_layers(dtype: torch.dtype, ctxs: list[int], tile: int) -> None:
    """Rows of 1 to 1,100 context tokens (a padding row of context 0 among them), split and
    unsplit attention, attention tiles of 128 and 256 tokens, Q/K/V biases: the residual stream
    after every layer and the K/V written."""
    model = _model(dtype)
    for programs in ([3, 40] if DEV.type == "cpu" else [None, 8]):
        (h0, c0), (h1, c1) = _both(model, ctxs, 72, dtype, programs, attention_tile=tile)[0]
        _close(h1, h0)
        _close(c1, c0)


def test_attention_tile_must_be_a_power_of_two_multiple_of_128() -> None:
    model = _model(DTYPES[0])
    spec = ModelSpec.from_module(model)
    cache = KVCache.allocate(spec.num_layers, 4, BLOCK, spec.num_kv_heads, spec.head_dim, DTYPES[0], DEV)
    r = ModelRunner(model, cache, "torch", fused=False, pack=True, layer_kernel=False)
    for bad in (64, 192, 384):
        with pytest.raises(ValueError, match="attention_tile"):
            tdl.DecodeLayerKernel(r, attention_tile=bad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_kernel_head_dim_128_without_bias(dtype: torch.dtype) -> None:
    """Head dim 128, a group of 4 query heads per KV head, no biases (Llama)."""
    model = _model(dtype, hidden=512, heads=4, kv_heads=1, bias=False)
    (h0, c0), (h1, c1) = _both(model, [40, 600, 0], 40, dtype, 3 if DEV.type == "cpu" else None)[0]
    _close(h1, h0)
    _close(c1, c0)


def test_split_choice() -> None:
    """Splits: a power of two, as many items as programs at most, a tile per split at least."""
    assert tdl.num_splits_for(16, 2, 8192, 132) == 4  # 128 items on 132 SMs
    assert tdl.num_splits_for(1, 2, 8192, 132) == 64  # 128-token splits of an 8k table
    assert tdl.num_splits_for(64, 2, 8192, 132) == 1
    assert tdl.num_splits_for(4, 2, 256, 132) == 2
    assert tdl.num_splits_for(4, 2, 128, 132) == 1  # one tile of context: never split
    assert tdl.num_splits_for(1, 2, 8192, 132, tile=256) == 32  # 256-token splits


def test_unsupported_models_are_refused() -> None:
    model = _model(DTYPES[0])
    spec = ModelSpec.from_module(model)
    cache = KVCache.allocate(spec.num_layers, 4, BLOCK, spec.num_kv_heads, spec.head_dim, torch.float32, DEV)
    r = ModelRunner(model, cache, "torch", fused=False, pack=True, layer_kernel=False)
    assert "compute dtype" in tdl.unsupported_reason(r)
    with pytest.raises(ValueError, match="cannot run this model"):
        tdl.DecodeLayerKernel(r)


@pytest.mark.skipif(DEV.type != "cuda", reason="CUDA graphs")
def test_captured_decode_step_with_layer_kernel_matches_per_op_step() -> None:
    """A whole captured decode step (DecodeGraphs, padding rows included) with the layer kernel
    gives the per-op step's logits, and the same greedy tokens where the top two differ clearly."""
    from rlforge.rollout.native.cuda_graph import DecodeGraphs

    model = _model(torch.bfloat16, layers=3)
    spec = ModelSpec.from_module(model)
    ctxs = [1, 17, 1000, 129, 300, 64, 2]
    cache, bt, ctx, pos, slot, ids = _batch(spec, ctxs, 72, torch.bfloat16)
    logits = []
    for kernel in (False, True):
        c = KVCache(cache.data.clone())
        r = ModelRunner(model, c, "triton", layer_kernel=kernel)
        assert (r.layer_kernel is not None) == kernel
        r.refresh_weights()
        g = DecodeGraphs(r, [8], 72, 0)
        g.buf.input_ids[:7], g.buf.positions[:7], g.buf.slot_mapping[:7] = ids, pos, slot
        g.buf.block_tables[:7], g.buf.context_lens[:7] = bt, ctx
        g.reset_padding(7, 8)
        logits.append(g.replay(8)[:7].float().clone())
        g.replay(8)  # a second replay: the barrier and split counters start from zero again
        torch.testing.assert_close(g.logits[:7].float(), logits[-1])
    _close(logits[1], logits[0])
    top2 = logits[0].topk(2, -1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.1
    assert torch.equal(logits[1].argmax(-1)[clear], logits[0].argmax(-1)[clear])

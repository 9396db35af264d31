"""The fused Triton layer kernels (rlforge/rollout/native/triton_fused.py) against the eager ops
of the model runner, op by op and through a whole decode forward.

Runs on CUDA, or on CPU under Triton's interpreter (``TRITON_INTERPRET=1 pytest ...``, with
the ``triton`` package installed); skipped otherwise."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")

if torch.cuda.is_available():
    DEV = torch.device("cuda")
elif os.environ.get("TRITON_INTERPRET") == "1":
    DEV = torch.device("cpu")
else:
    pytest.skip("needs CUDA, or TRITON_INTERPRET=1 to run the kernels on CPU", allow_module_level=True)

from rlforge.rollout.native.model_runner import rms_norm, rotate_half  # noqa: E402
from rlforge.rollout.native.triton_fused import add_rms_norm, rope_and_cache, silu_mul  # noqa: E402

DTYPES = [torch.bfloat16, torch.float32]


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    """Equal up to a rounding step of ``dtype``: the kernels round where torch rounds, but the
    order of the float32 reduction inside RMSNorm differs, and Triton's CPU interpreter
    rounds float32 -> bfloat16 differently from CUDA."""
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-5
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [64, 896])
def test_add_rms_norm_matches_eager(dtype: torch.dtype, n: int) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(37, n, generator=g).to(DEV, dtype)
    r = torch.randn(37, n, generator=g).to(DEV, dtype) * 3
    w = (1 + 0.1 * torch.randn(n, generator=g)).to(DEV, dtype)
    out, summed = add_rms_norm(x, w, 1e-6, residual=r)
    ref_sum = r + x
    _close(summed, ref_sum, dtype)  # one rounded add, as torch does it
    _close(out, rms_norm(ref_sum, w, 1e-6), dtype)
    out0, same = add_rms_norm(x, w, 1e-6)
    assert same.data_ptr() == x.data_ptr()
    _close(out0, rms_norm(x, w, 1e-6), dtype)
    # a 3-D input (Qwen3's per-head q_norm) normalises its last dimension
    x3 = x.view(37, -1, 32) if n % 32 == 0 else x[:, :64].reshape(37, 2, 32)
    _close(add_rms_norm(x3.contiguous(), w[:32], 1e-6)[0], rms_norm(x3, w[:32], 1e-6), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul_matches_eager(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    gate = (3 * torch.randn(9, 4864 + 8, generator=g)).to(DEV, dtype)  # two column tiles, a ragged one
    up = torch.randn(9, 4864 + 8, generator=g).to(DEV, dtype)
    _close(silu_mul(gate, up), F.silu(gate) * up, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(14, 2, 64), (4, 4, 32), (28, 4, 128)])
def test_rope_and_cache_matches_eager(dtype: torch.dtype, heads: tuple[int, int, int]) -> None:
    h, kvh, d = heads
    t, slots = 11, 64
    g = torch.Generator().manual_seed(2)
    q = torch.randn(t, h, d, generator=g).to(DEV, dtype)
    kv = torch.randn(t, 2 * kvh, d, generator=g).to(DEV, dtype)
    k, v = kv[:, :kvh], kv[:, kvh:]  # strided views, as the runner may pass
    pos = torch.randint(0, 4000, (t,), generator=g).float()
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    emb = torch.cat([pos[:, None] * inv, pos[:, None] * inv], -1)
    cos, sin = (emb.cos() * 1.1).to(DEV, dtype), (emb.sin() * 1.1).to(DEV, dtype)
    slot = torch.randperm(slots, generator=g)[:t].to(DEV)
    kc = torch.zeros(slots, kvh, d, dtype=dtype, device=DEV)
    vc = torch.zeros_like(kc)
    q_out = rope_and_cache(q, k, v, cos, sin, slot, kc, vc)
    c, s = cos[:, None, :], sin[:, None, :]
    # exact: the kernel rounds each product and the sum as torch's ops do (bit operations in bf16,
    # so no compiler may fuse them; an H200 build that did put 18% of the elements 1-2 ulps off)
    assert torch.equal(q_out, q * c + rotate_half(q) * s)
    ref_k, ref_v = torch.zeros_like(kc), torch.zeros_like(vc)
    ref_k[slot] = k * c + rotate_half(k) * s
    ref_v[slot] = v
    assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)  # untouched slots stay zero


def test_rope_and_cache_rejects_odd_head_dim() -> None:
    q = torch.zeros(2, 2, 6, device=DEV)
    with pytest.raises(ValueError, match="power-of-two head dimension"):
        rope_and_cache(q, q, q, q[:, 0], q[:, 0], torch.zeros(2, dtype=torch.long, device=DEV), q, q)


def test_fused_decode_forward_matches_eager_forward(tiny_tokenizer) -> None:
    """A whole mixed step (a prefill chunk and decode rows) through the fused body equals the
    eager body: logits and the K/V written to the cache."""
    from rlforge.models import load_causal_lm
    from rlforge.rollout.native.kv_cache import KVCache
    from rlforge.rollout.native.model_runner import ModelRunner, ModelSpec, step_inputs

    model = load_causal_lm("preset:tiny", tiny_tokenizer, {"initializer_range": 0.2}, seed=0).to(DEV).eval()
    spec = ModelSpec.from_module(model)
    logits, caches = [], []
    for fused in (False, True):
        cache = KVCache.allocate(spec.num_layers, 8, 4, spec.num_kv_heads, spec.head_dim, torch.float32, DEV)
        runner = ModelRunner(model, cache, attention="torch")
        runner.fused = fused
        # sequence 0: 6 prompt tokens in blocks [1, 2]; sequence 1: 1 token at position 0 in block [3]
        ids = [5, 9, 2, 7, 7, 1, 4]
        pos = [0, 1, 2, 3, 4, 5, 0]
        slots = [4, 5, 6, 7, 8, 9, 12]
        inp = step_inputs(ids, pos, slots, [0, 6], [6, 1], [6, 1], [[1, 2], [3]], [5, 6], [0, 1], DEV, 4)
        logits.append(runner.run(inp))
        caches.append(cache.data.clone())
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[1], caches[0], rtol=1e-5, atol=1e-5)

"""The decode-size fused GEMMs (rlforge/rollout/native/triton_skinny.py) against the eager ops
they replace: ``add_rms_norm`` / ``silu_mul`` / ``F.linear`` of the model runner's fused path.

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

from rlforge.rollout.native.model_runner import rms_norm  # noqa: E402
from rlforge.rollout.native.triton_fused import add_rms_norm, silu_mul  # noqa: E402
from rlforge.rollout.native.triton_skinny import (  # noqa: E402
    MAX_ROWS,
    Rows,
    SkinnyConfig,
    _counters,
    skinny_linear,
)


def _data(m: int, n: int, k: int, dtype: torch.dtype, seed: int, in_k: int | None = None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, in_k or k, generator=g).to(DEV, dtype)
    w = (torch.randn(n, k, generator=g) / k ** 0.5).to(DEV, dtype)
    b = torch.randn(n, generator=g).to(DEV, dtype)
    return x, w, b


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype | None) -> None:
    """Equal up to the compute dtype's rounding: the float32 sums run in another order (None: up
    to a few bfloat16 steps, for a bfloat16 reference that rounds elsewhere than the kernel)."""
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-5 if dtype == torch.float32 else 0.15
    torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)


CONFIGS = [SkinnyConfig(64, 32, 1), SkinnyConfig(32, 32, 3), SkinnyConfig(16, 64, 2, num_warps=2)]
DTYPES = [torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("m", [1, 5, 16, 32])
def test_plain_and_bias_match_linear(dtype: torch.dtype, cfg: SkinnyConfig, m: int) -> None:
    x, w, b = _data(m, 100, 96, dtype, seed=m)  # 100 outputs: a ragged last tile of every block_n
    _close(skinny_linear(x, w, config=cfg), F.linear(x, w), dtype)
    _close(skinny_linear(x, w, b, config=cfg), F.linear(x, w, b), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS)
def test_rms_norm_prologue_matches_norm_then_linear(dtype: torch.dtype, cfg: SkinnyConfig) -> None:
    x, w, b = _data(7, 80, 160, dtype, seed=1)
    x = x * 3 + 1
    nw = (1 + 0.1 * torch.randn(160)).to(DEV, torch.float32)  # a float32 norm weight, as the trainer's master
    ref = F.linear(rms_norm(x, nw, 1e-6).to(dtype), w, b)
    _close(skinny_linear(x, w, b, norm_weight=nw, eps=1e-6, config=cfg), ref, dtype)
    # the statistics as per-tile partial sums (what a residual epilogue writes) give the same rows
    ss = (x.float() ** 2).view(7, 4, 40).sum(-1).T.contiguous()  # [4 tiles, 7 rows]
    _close(skinny_linear(x, w, b, norm_weight=nw, eps=1e-6, norm_ss=ss, config=cfg), ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS)
def test_silu_prologue_matches_silu_mul_then_linear(dtype: torch.dtype, cfg: SkinnyConfig) -> None:
    gu, w, _ = _data(9, 72, 112, dtype, seed=2, in_k=224)
    gu = gu * 3
    gate, up = gu[:, :112], gu[:, 112:]
    act = (F.silu(gate) * up).to(dtype)
    _close(skinny_linear(gu, w, silu=True, config=cfg), F.linear(act, w), dtype if dtype == torch.float32 else None)
    # the launch it replaces (the fused SiLU·mul kernel, then the GEMM): on CUDA both round as torch does; the
    # CPU interpreter rounds float32 -> bfloat16 its own way, the same way in both kernels
    _close(skinny_linear(gu, w, silu=True, config=cfg), F.linear(silu_mul(gate, up), w), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cfg", CONFIGS)
def test_residual_epilogue_gives_sum_and_its_squares(dtype: torch.dtype, cfg: SkinnyConfig) -> None:
    x, w, b = _data(6, 100, 64, dtype, seed=3)
    r = torch.randn(6, 100).to(DEV, dtype) * 2
    out = skinny_linear(x, w, b, residual=r, config=cfg)
    assert isinstance(out, Rows)
    ref = r + F.linear(x, w, b)
    _close(out.h, ref, dtype)
    assert out.ss.shape == (triton.cdiv(100, cfg.block_n), 6)
    torch.testing.assert_close(out.ss.sum(0), (out.h.float() ** 2).sum(1), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_layer_chain_matches_the_eager_layer(dtype: torch.dtype) -> None:
    """O-proj with the residual, gate/up with the RMSNorm from its partial sums, down with
    SiLU·mul and the residual: the MLP half of a decoder layer, against eager ops."""
    g = torch.Generator().manual_seed(4)
    m, hid, inter = 5, 96, 160
    a = torch.randn(m, hid, generator=g).to(DEV, dtype)
    h0 = (2 * torch.randn(m, hid, generator=g)).to(DEV, dtype)
    wo = (torch.randn(hid, hid, generator=g) / hid ** 0.5).to(DEV, dtype)
    wgu = (torch.randn(2 * inter, hid, generator=g) / hid ** 0.5).to(DEV, dtype)
    wd = (torch.randn(hid, inter, generator=g) / inter ** 0.5).to(DEV, dtype)
    nw = (1 + 0.1 * torch.randn(hid, generator=g)).to(DEV, dtype)
    cfg = SkinnyConfig(32, 32, 2)
    r1 = skinny_linear(a, wo, residual=h0, config=cfg)
    gu = skinny_linear(r1.h, wgu, norm_weight=nw, eps=1e-6, norm_ss=r1.ss, config=cfg)
    r2 = skinny_linear(gu, wd, silu=True, residual=r1.h, config=cfg)
    # the model runner's fused path: cuBLAS GEMMs between the add+RMSNorm and SiLU·mul kernels
    x1, h1 = add_rms_norm(F.linear(a, wo), nw, 1e-6, residual=h0)
    gu_ref = F.linear(x1, wgu)
    h2 = h1 + F.linear(silu_mul(gu_ref[:, :inter], gu_ref[:, inter:]), wd)
    _close(r1.h, h1, dtype)
    _close(gu, gu_ref, dtype)
    _close(r2.h, h2, dtype)


def test_repeated_split_launches_are_deterministic_and_reset_their_counters() -> None:
    x, w, b = _data(16, 128, 256, torch.bfloat16, seed=5)
    cfg = SkinnyConfig(32, 32, 8)
    first = skinny_linear(x, w, b, config=cfg)
    for _ in range(3):
        assert torch.equal(skinny_linear(x, w, b, config=cfg), first)
    assert int(_counters(x.device, 4)[:64].abs().sum()) == 0


def test_bad_input_is_refused() -> None:
    x, w, _ = _data(MAX_ROWS + 1, 32, 32, torch.float32, seed=6)
    with pytest.raises(ValueError, match="at most"):
        skinny_linear(x, w)
    with pytest.raises(ValueError, match="cannot both"):
        skinny_linear(x[:4], w, norm_weight=torch.ones(32, device=DEV), silu=True)
    with pytest.raises(ValueError, match="does not match"):
        skinny_linear(x[:4, :16], w)
    with pytest.raises(ValueError, match="residual"):
        skinny_linear(x[:4], w, residual=torch.zeros(3, 32, device=DEV))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="programmatic dependent launch needs a CUDA GPU")
def test_programmatic_dependent_launch_gives_the_same_rows_eager_and_in_a_graph() -> None:
    """A layer chain launched with PDL (each kernel may start before the previous ends and waits
    for its outputs) equals the same chain without it, bit for bit, run eagerly and replayed
    from a CUDA graph (where a missing wait would read a half-written residual)."""
    from rlforge.rollout.native.triton_skinny import pdl_supported

    if not pdl_supported(DEV):
        pytest.skip("programmatic dependent launch needs compute capability 9.0")
    g = torch.Generator().manual_seed(7)
    m, hid, inter = 16, 896, 4864
    bf = torch.bfloat16
    a = torch.randn(m, hid, generator=g).to(DEV, bf)
    h0 = (2 * torch.randn(m, hid, generator=g)).to(DEV, bf)
    ws = [((torch.randn(hid, hid, generator=g) / hid ** 0.5).to(DEV, bf),
           (torch.randn(2 * inter, hid, generator=g) / hid ** 0.5).to(DEV, bf),
           (torch.randn(hid, inter, generator=g) / inter ** 0.5).to(DEV, bf)) for _ in range(4)]
    nw = (1 + 0.1 * torch.randn(hid, generator=g)).to(DEV, bf)

    def chain(pdl: bool) -> torch.Tensor:
        h, ss = h0, None
        for wo, wgu, wd in ws:
            x = skinny_linear(h, wo, norm_weight=nw, eps=1e-6, norm_ss=ss, pdl=pdl)  # a QKV-like GEMM
            r = skinny_linear(x + a, wo, residual=h, pdl=pdl)
            gu = skinny_linear(r.h, wgu, norm_weight=nw, eps=1e-6, norm_ss=r.ss, pdl=pdl)
            r = skinny_linear(gu, wd, silu=True, residual=r.h, pdl=pdl)
            h, ss = r.h, r.ss
        return h

    ref = chain(False)
    assert torch.equal(chain(True), ref)
    out = torch.empty_like(ref)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(chain(True))
    for _ in range(3):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref)

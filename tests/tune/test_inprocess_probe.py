"""The in-process probe (rlforge/tune/inprocess.py) on CPU: the selection with fake timings, and that a
probe leaves weights, optimizer state, gradients and RNG bit for bit as they were.

The engine is the run's own (FSDP2 on a one-rank gloo group, the seeded tiny model), with the levers
the tuner chose for a fake 80 GB device written into a loaded config; ``probe_job`` runs on the CPU
here (the trainer's hook, ``probe_at_start``, runs it only on a GPU).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import dist_common as dc  # noqa: E402

from rlforge.config import load_config  # noqa: E402
from rlforge.config.common import FSDPConfig  # noqa: E402
from rlforge.engine import ENGINES  # noqa: E402
from rlforge.engine.activation import LayerWrapper, apply_activation_wrappers, decoder_layers  # noqa: E402
from rlforge.engine.distributed import init_single_process  # noqa: E402
from rlforge.roles.actor import Actor  # noqa: E402
from rlforge.tune import inprocess  # noqa: E402
from rlforge.tune.apply import apply_levers, config_levers  # noqa: E402
from rlforge.tune.device import fake_device  # noqa: E402
from rlforge.tune.inprocess import (  # noqa: E402
    Measurement,
    ProbeOutOfMemory,
    eligible,
    probe_at_start,
    probe_job,
)
from rlforge.tune.switch import switchable, use_levers  # noqa: E402
from rlforge.tune.tuner import plan_config  # noqa: E402

CPU = torch.device("cpu")
A = "actor_rollout_ref"
WORKLOAD = [f"{A}.model.path=preset:tiny", "data.max_prompt_length=7", "data.max_response_length=8",
            "data.train_batch_size=6", f"{A}.rollout.n=1", f"{A}.actor.ppo_mini_batch_size=6",
            f"{A}.actor.strategy=fsdp2", "algorithm.adv_estimator=grpo"]


def tuned():
    """A loaded config with the tuner's choice for a fake 80 GB GPU written in, and its plan."""
    cfg = load_config(WORKLOAD)
    plan = plan_config(cfg, fake_device(80))
    apply_levers(cfg, plan.chosen.levers)
    return cfg, plan


def make_job(cfg):
    """The actor as the job builder makes it from ``cfg`` (switchable checkpointing, reshard, budgets)."""
    init_single_process(CPU)
    model, tok = dc.load_model()
    batch = dc.make_batch(model, tok)
    arr = cfg.actor_rollout_ref
    apply_activation_wrappers(model, bool(arr.model.enable_gradient_checkpointing), False, switchable=True)
    acfg = dc.actor_cfg()
    fsdp = FSDPConfig()
    fsdp.reshard_after_forward = bool(arr.actor.fsdp_config.reshard_after_forward)
    engine = ENGINES.get("fsdp2")(model, CPU, fsdp_config=fsdp, optim_cfg=acfg.optim, total_steps=10,
                                  grad_clip=acfg.grad_clip)
    budget = int(arr.actor.ppo_max_token_len_per_gpu) if arr.actor.use_dynamic_bsz else None
    lp = int(arr.rollout.log_prob_max_token_len_per_gpu) if arr.actor.use_dynamic_bsz else None
    actor = Actor(engine, acfg, mini_batch_size=len(batch), micro_batch_size=2, log_prob_micro_batch_size=6,
                  max_token_len=budget, log_prob_max_token_len=lp)
    return SimpleNamespace(actor=actor, reference=None, critic=None, device=CPU), batch


def reshards(layer) -> bool:
    return layer._get_fsdp_state()._fsdp_param_groups[0].post_forward_mesh_info is not None


def checkpointing(actor) -> bool:
    flags = {m.checkpointing for m in actor.engine.module.modules() if isinstance(m, LayerWrapper)}
    assert len(flags) == 1
    return flags.pop()


def snapshot(actor):
    eng = actor.engine
    params = {k: v.detach().clone() for k, v in eng.module.state_dict().items()}
    optim = {i: {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in s.items()}
             for i, s in enumerate(eng.optimizer.state.values())}
    rng = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone())
    return params, optim, rng


def test_the_plan_leaves_several_candidates_to_probe():
    cfg, plan = tuned()
    job, _ = make_job(cfg)
    names = switchable(job)
    assert names == {"token_budget", "log_prob_budget", "checkpointing", "reshard"}
    cands = eligible(plan, config_levers(cfg), names)
    assert cands[0].levers == plan.chosen.levers  # the built setting is the predicted best
    assert len({(c.levers.checkpointing, c.levers.reshard) for c in cands}) == 4


def test_a_probe_changes_no_weight_optimizer_state_gradient_or_rng(capsys):
    cfg, plan = tuned()
    job, batch = make_job(cfg)
    job.actor.update(batch, dc.TEMPERATURE)  # the optimizer has state to keep
    torch.manual_seed(123)
    random.seed(5)
    np.random.seed(7)
    before = snapshot(job.actor)
    report = probe_job(cfg, job, plan, k=2, repeats=2)  # two passes each: the gradients accumulate, then go
    assert report is not None and len(report.measured) == 2 and not report.dropped
    after = snapshot(job.actor)
    for k in before[0]:
        assert torch.equal(before[0][k], after[0][k]), k
    assert before[1].keys() == after[1].keys()
    for i in before[1]:
        for k, v in before[1][i].items():
            assert torch.equal(v, after[1][i][k]) if torch.is_tensor(v) else v == after[1][i][k]
    assert before[2][0] == after[2][0] and np.array_equal(before[2][1], after[2][1])
    assert torch.equal(before[2][2], after[2][2])
    assert all(p.grad is None for p in job.actor.engine.module.parameters())
    assert job.actor.engine.module.training
    out = capsys.readouterr().out
    assert "rlforge tune: probed 2 candidates in" in out and "<- chosen" in out


def _first_step(cfg, probe: int | None):
    """One update from fresh seeded weights; ``probe``: the probe's k first (None: no probe), then the
    built levers back in force."""
    job, batch = make_job(cfg)
    built = config_levers(cfg)
    if probe is not None:
        plan = plan_config(cfg, fake_device(80))
        probe_job(cfg, job, plan, k=probe, repeats=1, out=lambda _line: None)
        use_levers(cfg, job, built)
    metrics = job.actor.update(batch, dc.TEMPERATURE).metrics
    return {k: v.detach().clone() for k, v in job.actor.engine.module.state_dict().items()}, metrics


@pytest.mark.parametrize("k", [1, 4])
def test_a_probe_whose_choice_is_the_default_gives_the_same_first_step(k):
    """k=1: only the built (predicted best) setting is measured, so it stays; k=4: every checkpointing /
    reshard setting is switched on and measured, then the built one is put back.  The first update is the
    same, bit for bit, as that of a run without a probe."""
    cfg, _ = tuned()
    ref_w, ref_m = _first_step(cfg, None)
    w, m = _first_step(cfg, k)
    assert ref_m == m
    for key in ref_w:
        assert torch.equal(ref_w[key], w[key]), key


def _fake_measure(step_s_by_ckpt_reshard, oom=()):
    """A ``measure_update`` stand-in: a fixed seconds-per-token per (checkpointing, reshard); those in
    ``oom`` run out of memory."""
    def measure(actor, lev, prompt_len, response_len, vocab, temperature=1.0, repeats=2):
        key = (lev.checkpointing, lev.reshard)
        if key in oom:
            raise ProbeOutOfMemory("CUDA out of memory. Tried to allocate 2.00 GiB")
        return Measurement(step_s_by_ckpt_reshard[key], 0.0, 90)
    return measure


def test_the_fastest_measured_wins_even_if_predicted_slower(monkeypatch):
    cfg, plan = tuned()
    job, _ = make_job(cfg)
    cands = eligible(plan, config_levers(cfg), switchable(job))
    slowest = cands[-1].levers  # predicted slowest of the four
    key = (slowest.checkpointing, slowest.reshard)
    speeds = {(c.levers.checkpointing, c.levers.reshard): 1.0 for c in cands} | {key: 1e-3}
    monkeypatch.setattr(inprocess, "measure_update", _fake_measure(speeds, oom={(False, False)} - {key}))
    report = probe_job(cfg, job, plan, k=4, out=lambda _line: None)
    assert report.chosen == slowest and plan.chosen.levers == slowest
    assert len(report.dropped) == (0 if key == (False, False) else 1)
    # the choice is in force: the config's free keys and the engine
    assert bool(cfg.actor_rollout_ref.model.enable_gradient_checkpointing) == slowest.checkpointing
    assert bool(cfg.actor_rollout_ref.actor.fsdp_config.reshard_after_forward) == slowest.reshard
    assert checkpointing(job.actor) == slowest.checkpointing
    assert all(reshards(layer) == slowest.reshard for layer in decoder_layers(job.actor.engine.module))
    metrics = report.metrics()
    assert metrics["tune/probe_candidates"] == 4 and metrics["tune/probe_s"] >= 0


def test_every_probe_out_of_memory_keeps_the_safest_setting_with_one_warning(monkeypatch, capsys):
    cfg, plan = tuned()
    job, _ = make_job(cfg)
    cands = eligible(plan, config_levers(cfg), switchable(job))
    everything = {(c.levers.checkpointing, c.levers.reshard) for c in cands}
    monkeypatch.setattr(inprocess, "measure_update", _fake_measure({}, oom=everything))
    report = probe_job(cfg, job, plan, k=4)
    safest = min(cands, key=lambda c: c.peak_bytes).levers
    assert report.all_dropped and report.chosen == safest and len(report.dropped) == 4
    assert checkpointing(job.actor) == safest.checkpointing
    err = capsys.readouterr().err
    assert err.count("rlforge: warning:") == 1 and "every probed candidate ran out of memory" in err


def test_user_set_levers_are_not_probed():
    """Budget, checkpointing and resharding all the user's: nothing to probe, the engine untouched."""
    cfg = load_config([*WORKLOAD, f"{A}.actor.ppo_max_token_len_per_gpu=90", f"{A}.actor.use_dynamic_bsz=true",
                       f"{A}.model.enable_gradient_checkpointing=true",
                       f"{A}.actor.fsdp_config.reshard_after_forward=true"])
    plan = plan_config(cfg, fake_device(80))
    apply_levers(cfg, plan.chosen.levers)
    job, _ = make_job(cfg)
    assert probe_job(cfg, job, plan) is None
    assert checkpointing(job.actor) is True


def test_the_start_hook_never_probes_on_a_cpu():
    cfg, _ = tuned()
    job = SimpleNamespace(device=CPU)  # nothing else is read on a CPU
    assert probe_at_start(cfg, job, 1) == {}


def test_preserved_rng_puts_every_generator_back():
    before = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    with inprocess.preserved_rng():
        random.random(), np.random.rand(), torch.rand(4)
    after = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    assert after == (random.random(), float(np.random.rand()), float(torch.rand(1))) != before


def test_rlforge_tune_probe_path_on_a_built_job(tmp_path, capsys):
    """``rlforge tune --probe``'s code on the job the trainer builds (the tiny preset, on the CPU here):
    the engines are built switchable, the probe measures and leaves engines and config in agreement."""
    import os

    from helpers import SMALL

    from rlforge.tune.inprocess import probe_for_tune

    tok = os.environ.get("RLFORGE_TEST_TOKENIZER")
    cfg = load_config([*SMALL, f"trainer.default_local_dir={tmp_path}", "data.max_prompt_length=48",
                       *([f"{A}.model.tokenizer_path={tok}"] if tok else [])], job="default")
    plan = plan_config(cfg, fake_device(80, name="test-gpu"))  # a named fake GPU: liger as installed (not here)
    report = probe_for_tune(cfg, plan, out=print)
    out = capsys.readouterr().out
    assert report is not None and report.measured and "rlforge tune: built the job" in out
    assert f"rlforge tune: probed {len(report.measured) + len(report.dropped)} candidates in" in out
    assert plan.chosen.levers == report.chosen and plan.measured_s
    assert bool(cfg.actor_rollout_ref.model.enable_gradient_checkpointing) == report.chosen.checkpointing



def test_a_real_out_of_memory_in_a_probe_pass_drops_the_candidate_and_changes_nothing():
    """The actor's forward raises CUDA's out-of-memory error whenever checkpointing is on (mid-step, the
    FSDP2 state unsharded): those candidates are dropped, the others measured, nothing else moved."""
    cfg, plan = tuned()
    job, batch = make_job(cfg)
    job.actor.update(batch, dc.TEMPERATURE)
    before = snapshot(job.actor)
    inner = job.actor.log_probs_fn

    def fn(module, mb, temperature, with_entropy):
        out = inner(module, mb, temperature, with_entropy)
        if torch.is_grad_enabled() and checkpointing(job.actor):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return out

    job.actor.log_probs_fn = fn
    report = probe_job(cfg, job, plan, k=4, repeats=1, out=lambda _line: None)
    assert len(report.dropped) == 2 and all(lev.checkpointing for lev in report.dropped)
    assert len(report.measured) == 2 and not report.chosen.checkpointing and not checkpointing(job.actor)
    after = snapshot(job.actor)
    assert all(torch.equal(before[0][k], after[0][k]) for k in before[0])
    assert all(p.grad is None for p in job.actor.engine.module.parameters())
    job.actor.log_probs_fn = inner
    job.actor.update(batch, dc.TEMPERATURE)  # the engine still trains after the failed passes

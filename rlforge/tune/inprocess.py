"""In-process probes: the best few candidates measured on the run's own engines, before step 1 (issue 39).

The model is loaded once: the probe runs inside the training process (``rlforge train``, and
``rlforge tune --probe``, which builds the same job) after the engines are built.  Only the levers
that switch at run time are probed (:data:`PROBED`): the token budgets (the roles'
:class:`~rlforge.roles.common.MicroBudget`), gradient checkpointing (the decoder layers'
:class:`~rlforge.engine.activation.LayerWrapper`, built switchable when the tuner owns the key) and
FSDP2's ``reshard_after_forward`` (``set_reshard_after_forward`` on each decoder layer).  Offload,
liger, the padding-free forward and the rollout's keys are the memory model's choice and stay as built:
a candidate is probed only if it differs from the built setting in probed levers alone.

One probe: the update stage at the run's real shapes with synthetic token ids (full-length rows of
``max_prompt_length + max_response_length`` tokens, as many as the candidate's token budget holds),
forward+backward passes through the actor's own training forward, timed with the device synchronised:
the first candidate runs ``repeats`` passes and times the last (the first pays the process's one-time
kernel loading and the allocator's growth), the others one.  No optimizer step: the gradients are
dropped after, the module's mode and every RNG state put back, so the run goes on bit for bit as without
the probe.  With ``param_offload`` the weights come to the device once for all candidates.

Score of a candidate (seconds per step): the time model's step (:func:`rlforge.tune.timing.step_time`)
with the update's forward+backward replaced by the measured seconds per token times the step's
tokens.  Memory: ``torch.cuda.max_memory_allocated`` over the probe plus what is not allocated yet
before step 1 (the AdamW moments, created at the first optimizer step, and with
``free_cache_engine=false`` the rollout's idle cache: the memory model's bytes for them); above
:data:`MEMORY_FRACTION` of the device the candidate is dropped as if it had run out of memory.
"""

from __future__ import annotations

import gc
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from rlforge.batch import Batch
from rlforge.engine.staging import stage
from rlforge.tune.apply import apply_levers, config_levers
from rlforge.tune.levers import LEVER_NAMES, Levers
from rlforge.tune.plan import Candidate, Plan, choose
from rlforge.tune.probe import ProbeOutOfMemory, is_oom, probe_best
from rlforge.tune.switch import switchable, use_levers
from rlforge.tune.timing import optimizer_time

PROBED = ("token_budget", "log_prob_budget", "checkpointing", "reshard")
"""The levers a probe may change (the rest stay as the engines were built)."""
MEMORY_FRACTION = 0.92
"""A candidate whose measured peak (plus what step 1 will still allocate) passes this share of the
device memory is dropped."""
MAX_PROBE_S = 45.0
"""No further candidate starts after this many seconds of probing (the first always runs)."""
DISABLE_ENV = "RLFORGE_TUNE_PROBE"
"""``RLFORGE_TUNE_PROBE=0`` turns the start-of-run probe off (the memory model's choice stands)."""

@dataclass
class Measurement:
    """One probed candidate: ``s_per_token`` (forward+backward seconds per token of the timed pass),
    ``peak_bytes`` (measured peak plus what step 1 still allocates; 0 on a CPU), ``tokens`` of the
    timed micro-batch, ``step_s`` (the score: predicted step with the measured update)."""

    s_per_token: float
    peak_bytes: float
    tokens: int
    step_s: float = 0.0


@dataclass
class ProbeReport:
    """The probe's outcome: wall ``seconds``, each measured candidate, the dropped ones, the levers
    in force after it (``chosen``) and whether every probe failed (``all_dropped``)."""

    seconds: float
    measured: dict[Levers, Measurement] = field(default_factory=dict)
    dropped: list[Levers] = field(default_factory=list)
    chosen: Levers | None = None
    all_dropped: bool = False
    lines: list[str] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """``tune/probe_s``, ``tune/probe_candidates``, ``tune/probe_dropped`` and, per measured
        candidate ``i`` (in the printed order), ``tune/probe/c<i>/step_s`` and ``.../peak_gb``."""
        out = {"tune/probe_s": self.seconds, "tune/probe_candidates": float(len(self.measured) + len(self.dropped)),
               "tune/probe_dropped": float(len(self.dropped))}
        for i, m in enumerate(self.measured.values()):
            out[f"tune/probe/c{i}/step_s"] = m.step_s
            out[f"tune/probe/c{i}/peak_gb"] = m.peak_bytes / 1e9
        return out


# ------------------------------------------------------------------ one measurement
def synthetic_batch(rows: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> Batch:
    """``rows`` full-length rows (no padding) of random token ids below ``vocab``, laid out as a
    rollout's batch: ``prompts`` ``(rows, prompt_len)``, ``responses`` ``(rows, response_len)``,
    ``input_ids`` / ``attention_mask`` / ``position_ids`` ``(rows, prompt_len + response_len)``,
    ``response_mask`` all ones.  A local generator: the global RNG is not touched."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, max(2, vocab), (rows, prompt_len + response_len), generator=g)
    seq = prompt_len + response_len
    return Batch.from_dict({
        "prompts": ids[:, :prompt_len], "responses": ids[:, prompt_len:], "input_ids": ids,
        "attention_mask": torch.ones(rows, seq, dtype=torch.long),
        "position_ids": torch.arange(seq).expand(rows, seq).clone(),
        "response_mask": torch.ones(rows, response_len, dtype=torch.long),
    })


@contextmanager
def preserved_rng() -> Iterator[None]:
    """Every RNG state a step reads (Python, NumPy, torch's CPU and, once initialised, CUDA's) put back after."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    state = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
             torch.cuda.get_rng_state_all() if cuda else None)
    try:
        yield
    finally:
        random.setstate(state[0])
        np.random.set_state(state[1])
        torch.set_rng_state(state[2])
        if state[3] is not None:
            torch.cuda.set_rng_state_all(state[3])


def _drop_grads(module: torch.nn.Module) -> None:
    for p in module.parameters():
        p.grad = None


def _passes(actor: Any, mb: Batch, temperature: float, repeats: int, sync: Callable[[], None]) -> float:
    """``repeats`` forward+backward passes of ``mb`` through the actor's training forward (no
    optimizer step); seconds of the last one."""
    module = actor.engine.module
    need_entropy = float(getattr(actor.cfg, "entropy_coeff", 0.0)) != 0.0
    seconds = 0.0
    for _ in range(max(1, repeats)):
        sync()
        start = time.perf_counter()
        logp, ent, _extra = actor._forward(module, mb, temperature, need_entropy)
        mask = mb["response_mask"].float()
        loss = (logp.float() * mask).sum() / mask.sum().clamp(min=1.0)
        if ent is not None:
            loss = loss - 0.01 * (ent.float() * mask).sum() / mask.sum().clamp(min=1.0)
        loss.backward()
        del logp, ent, loss
        sync()
        seconds = time.perf_counter() - start
    return seconds


def measure_update(actor: Any, lev: Levers, prompt_len: int, response_len: int, vocab: int,
                   temperature: float = 1.0, repeats: int = 2) -> Measurement:
    """Time the actor's update at ``lev``'s micro-batch (the token budget with dynamic batching, else
    the micro-batch size in full rows), with the weights, optimizer state, gradients (None after),
    module mode and RNG as before.

    Raises:
        ProbeOutOfMemory: the device ran out of memory (the memory is released first).
    """
    engine = actor.engine
    seq = prompt_len + response_len
    dynamic = actor.train_budget.max_token_len is not None
    rows = max(1, lev.token_budget // seq) if dynamic else max(1, int(actor.train_budget.micro_batch_size))
    mb = stage([synthetic_batch(rows, prompt_len, response_len, vocab)], engine.device, engine.share_prompts)[0]
    cuda = engine.device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(engine.device)) if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats(engine.device)
    was_training, failed = engine.module.training, ""
    with preserved_rng(), engine.phase():
        engine.module.train()
        try:
            seconds = _passes(actor, mb, temperature, repeats, sync)
        except Exception as e:
            if not is_oom(e):
                raise
            failed = str(e).splitlines()[0] if str(e) else "out of memory"
        finally:
            _drop_grads(engine.module)
            engine.module.train(was_training)
    del mb
    if failed:  # outside the except block: the error's frames (and their tensors) are gone
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        raise ProbeOutOfMemory(failed)
    peak = float(torch.cuda.max_memory_allocated(engine.device)) if cuda else 0.0
    return Measurement(seconds / (rows * seq), peak, rows * seq)


# ------------------------------------------------------------------ the probe
def eligible(plan: Plan, built: Levers, names: set[str]) -> list[Candidate]:
    """The candidates worth probing, by predicted time: every lever outside ``names`` as ``built``, each
    combination of the free checkpointing / resharding with its largest fitting budgets (the planner's
    search restricted so: :func:`rlforge.tune.plan.choose`).  ``built`` is among them when it is the
    plan's choice."""
    from rlforge.errors import ConfigError

    if plan.inputs is None:
        return []
    fixed = {n: getattr(built, n) for n in LEVER_NAMES if n not in names}
    try:
        sub = choose(plan.inputs, fixed)
    except ConfigError:
        return []
    return sorted(sub.candidates, key=lambda c: c.time.total)


def unallocated_bytes(cand: Candidate, engine: Any) -> float:
    """What step 1 still allocates that the probe did not see: the AdamW moments (created at the first
    optimizer step) and the rollout's idle cache (``free_cache_engine=false``), the memory model's bytes."""
    parts = cand.memory["update_actor"].parts
    optimizer = getattr(engine, "optimizer", None)
    fresh = optimizer is not None and not optimizer.state and getattr(engine, "offloaded", None) is None
    return (parts.get("actor optimizer", 0.0) if fresh else 0.0) + parts.get("idle rollout cache", 0.0)


def _score(plan: Plan, cand: Candidate, m: Measurement) -> float:
    """Predicted seconds per step with the update's forward+backward as measured (module doc)."""
    assert plan.inputs is not None
    wl, inp = plan.workload, plan.inputs
    minis = max(1, -(-wl.rows // wl.mini_rows))
    update = m.s_per_token * wl.rows * wl.seq_len + minis * optimizer_time(inp.shape, wl, cand.levers, inp.device)
    return cand.time.total - cand.time.stages["update_actor"] + update


def safe_choice(cands: list[Candidate]) -> Candidate:
    """The memory model's safest of ``cands``: the smallest predicted peak."""
    return min(cands, key=lambda c: c.peak_bytes)


def _runner(cfg: Any, job: Any, plan: Plan, cands: list[Candidate], found: dict[Levers, Measurement],
            limit: float, repeats: int) -> Callable[[Levers], float]:
    """``run_probe`` for :func:`rlforge.tune.probe.probe_best`: switch, measure, score.  The first
    candidate runs ``repeats`` passes (the last timed), the others one."""
    by_levers = {c.levers: c for c in cands}
    tried: list[Levers] = []  # the first probe warms the process up (one-time kernel and allocator costs)
    wl, actor = plan.workload, job.actor
    vocab = plan.inputs.shape.vocab if plan.inputs is not None else 32000
    temperature = float(cfg.actor_rollout_ref.rollout.temperature)

    def run(lev: Levers) -> float:
        use_levers(cfg, job, lev)
        first = not tried
        tried.append(lev)
        m = measure_update(actor, lev, wl.prompt_len, wl.response_len, vocab, temperature, repeats if first else 1)
        cand = by_levers[lev]
        if limit > 0:
            m.peak_bytes += unallocated_bytes(cand, actor.engine)
            if m.peak_bytes > limit:
                raise ProbeOutOfMemory(f"peak {m.peak_bytes / 1e9:.1f} GB with step 1's optimizer state and "
                                       f"cache, above {limit / 1e9:.1f} GB")
        m.step_s = _score(plan, cand, m)
        found[lev] = m
        return m.step_s

    return run


def probe_job(cfg: Any, job: Any, plan: Plan, k: int = 3, repeats: int = 2, max_s: float = MAX_PROBE_S,
              out: Callable[[str], None] = print) -> ProbeReport | None:
    """Probe the best ``k`` eligible candidates of ``plan`` on ``job`` (module doc), keep the measured
    fastest (written into ``cfg``'s free keys and switched on in the engines), print the table.

    Returns None when no probed lever is free or fewer than two candidates are eligible (nothing to
    compare); the engines are then left as built.  Every probe dropped: the memory model's safest
    eligible candidate, with one warning on stderr.
    """
    free = switchable(job) - set(plan.fixed)
    built = config_levers(cfg)
    cands = eligible(plan, built, free) if free & {"token_budget", "checkpointing", "reshard"} else []
    if len(cands) < 2:
        return None
    start = time.perf_counter()
    cuda = job.actor.engine.device.type == "cuda"
    limit = MEMORY_FRACTION * torch.cuda.get_device_properties(job.actor.engine.device).total_memory if cuda else 0.0
    found: dict[Levers, Measurement] = {}
    try:
        with job.actor.engine.phase():  # param_offload: the weights come in once for every candidate
            winner, _, dropped = probe_best(cands, _runner(cfg, job, plan, cands, found, limit, repeats), k, max_s)
    except BaseException:
        use_levers(cfg, job, built)  # a failed probe leaves the engines as built
        raise
    report = ProbeReport(0.0, found, dropped, all_dropped=winner is None)
    final = winner or safe_choice(cands)
    use_levers(cfg, job, final.levers)
    if cuda:
        torch.cuda.empty_cache()
    report.chosen, report.seconds = final.levers, time.perf_counter() - start
    if winner is not None:
        plan.chosen = winner
    plan.measured_s.update({lev: m.step_s for lev, m in found.items()})
    report.lines = probe_lines(cands, report)
    for line in report.lines:
        out(line)
    if winner is None:
        print(f"rlforge: warning: every probed candidate ran out of memory; keeping the memory model's safest "
              f"setting ({describe(final.levers)}); online back-off covers the rest", file=sys.stderr, flush=True)
    return report


def describe(lev: Levers) -> str:
    """``budget 32768/65536, checkpointing off, reshard on`` (update / log-prob budgets)."""
    return (f"budget {lev.token_budget}/{lev.log_prob_budget}, checkpointing {'on' if lev.checkpointing else 'off'}, "
            f"reshard {'on' if lev.reshard else 'off'}")


def probe_lines(cands: list[Candidate], report: ProbeReport) -> list[str]:
    """The probe's part of the start-of-run table: one row per candidate tried, then the time line."""
    rows = []
    for c in cands:
        m = report.measured.get(c.levers)
        tried = m is not None or c.levers in report.dropped
        if not tried:
            continue
        measured = (f"{m.step_s:8.2f} {m.s_per_token * 1e6:9.2f} {m.peak_bytes / 1e9:8.1f}" if m is not None
                    else f"{'dropped (out of memory)':>27}")
        mark = " <- chosen" if c.levers == report.chosen else ""
        rows.append(f"  {describe(c.levers):<54} {c.time.total:9.2f} {measured}{mark}")
    n = len(report.measured) + len(report.dropped)
    head = f"  {'candidate':<54} {'pred s/step':>9} {'probed':>8} {'us/token':>9} {'peak GB':>8}"
    tail = (f"rlforge tune: probed {n} candidates in {report.seconds:.1f} s "
            f"({len(report.dropped)} ran out of memory and were dropped)")
    return [head, *rows, tail]


def probe_at_start(cfg: Any, job: Any, world_size: int, out: Callable[[str], None] = print) -> dict[str, float]:
    """``rlforge train``'s probe, after the engines are built: on a GPU, in a single process, when a
    probed lever is the tuner's and :data:`DISABLE_ENV` is not ``0``.  Returns its metrics (empty
    when it did not run).  A probe that fails for another reason than memory is one warning, and the
    engines stay as built."""
    if job.device.type != "cuda" or world_size != 1 or os.environ.get(DISABLE_ENV, "1") == "0":
        return {}
    from rlforge.errors import ConfigError
    from rlforge.tune.device import detect
    from rlforge.tune.tuner import plan_config

    try:
        plan = plan_config(cfg, detect())
    except ConfigError:
        return {}
    try:
        report = probe_job(cfg, job, plan, out=out)
    except Exception as e:  # a speed feature must not stop the run: the built setting stands
        print(f"rlforge: warning: the tuner's probe failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
              "keeping the memory model's choice", file=sys.stderr, flush=True)
        gc.collect()
        torch.cuda.empty_cache()
        return {}
    return report.metrics() if report is not None else {}



def probe_for_tune(cfg: Any, plan: Plan, out: Callable[[str], None] = print) -> ProbeReport | None:
    """``rlforge tune --probe``: build the run's job at ``plan``'s choice (the model loaded once, as
    ``rlforge train`` does), then the same probe as at the start of a run; ``plan`` gets the
    measured times and the measured best.  Returns None when there was nothing to probe."""
    from rlforge.trainer.build import build_job

    apply_levers(cfg, plan.chosen.levers)
    start = time.perf_counter()
    job = build_job(cfg)
    out(f"rlforge tune: built the job (model, rollout, data) in {time.perf_counter() - start:.1f} s; probing")
    try:
        report = probe_job(cfg, job, plan, out=out)
    finally:
        job.reward.close()
    if report is None:
        out("rlforge tune: nothing to probe (the probed levers are yours, or one candidate is eligible)")
    return report

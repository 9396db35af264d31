"""Online back-off (rlforge/trainer/backoff.py): a stage that runs out of memory halves its
tuner-owned budget or turns on checkpointing and redoes its work.

CPU: the out-of-memory error is raised by the actor's forward (after the model ran, so the
autograd graph and the FSDP2 state are mid-step) or by its backward, for a micro-batch above a token
threshold.  The redone update is compared with an independent reference: a fresh engine (same
seeded weights) that used the smaller budget, or checkpointing, from the start.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "distributed"))
import dist_common as dc  # noqa: E402

from rlforge.config import load_config  # noqa: E402
from rlforge.config.common import FSDPConfig  # noqa: E402
from rlforge.engine import ENGINES  # noqa: E402
from rlforge.engine.activation import LayerWrapper, apply_activation_wrappers  # noqa: E402
from rlforge.engine.distributed import init_single_process  # noqa: E402
from rlforge.errors import DeviceOutOfMemory  # noqa: E402
from rlforge.roles.actor import Actor  # noqa: E402
from rlforge.trainer.backoff import install_backoff, metric_name  # noqa: E402
from rlforge.trainer.oom import oom_guard  # noqa: E402
from rlforge.tune.apply import set_key  # noqa: E402

CPU = torch.device("cpu")
TEMP = dc.TEMPERATURE
ROW_TOKENS = [3, 15, 8, 13, 9, 8]  # dc.make_batch: prompt + valid response tokens per row (56 in all)
LONGEST = "data.max_prompt_length=7", "data.max_response_length=8"  # the budget's floor: 15 tokens
A = "actor_rollout_ref.actor"
BUDGET = f"{A}.ppo_max_token_len_per_gpu"
MICRO = f"{A}.ppo_micro_batch_size_per_gpu"
CKPT = "actor_rollout_ref.model.enable_gradient_checkpointing"


def oom() -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


class _RaiseInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):  # noqa: ANN001
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # noqa: ANN001
        raise oom()


def checkpointing_on(module: torch.nn.Module) -> bool:
    return any(isinstance(m, LayerWrapper) and m.checkpointing for m in module.modules())


def inject(actor: Actor, too_big, where: str = "forward") -> list[int]:
    """Make the actor's forward run out of memory on a micro-batch for which ``too_big(tokens, module)``
    holds: raised after the model's forward (``forward``) or from its backward (``backward``).
    Returns the token counts of the micro-batches that ran out of memory."""
    inner, failed = actor.log_probs_fn, []

    def fn(module, mb, temperature, with_entropy):
        logp, ent = inner(module, mb, temperature, with_entropy)
        tokens = int(mb["attention_mask"].sum())
        if torch.is_grad_enabled() and too_big(tokens, module):
            failed.append(tokens)
            if where == "forward":
                raise oom()
            logp = _RaiseInBackward.apply(logp)
        return logp, ent

    actor.log_probs_fn = fn
    return failed


def make_actor(budget: int | None, micro: int = 6, switchable: bool = False, checkpointing: bool = False,
               device: torch.device = CPU):
    """An FSDP2 actor (single process, on ``device``) on the seeded tiny model, and the batch."""
    init_single_process(device)
    model, tok = dc.load_model()
    batch = dc.make_batch(model, tok)
    if checkpointing or switchable:
        apply_activation_wrappers(model, checkpointing, False, switchable=switchable)
    acfg = dc.actor_cfg()
    engine = ENGINES.get("fsdp2")(model, device, fsdp_config=FSDPConfig(), optim_cfg=acfg.optim, total_steps=10,
                                  grad_clip=acfg.grad_clip)
    actor = Actor(engine, acfg, mini_batch_size=len(batch), micro_batch_size=micro, log_prob_micro_batch_size=6,
                  max_token_len=budget)
    return actor, batch


def weights(actor: Actor) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in actor.engine.full_params_iter(CPU)}


def tuned_config(*overrides: str, **tuner: object):
    """A loaded config (user keys recorded) whose ``tuner`` keys were written as the tuner writes them."""
    cfg = load_config([*LONGEST, *overrides])
    for key, value in tuner.items():
        set_key(cfg, key.replace("__", "."), value)
    return cfg


def watch(cfg, actor: Actor):
    lines: list[str] = []
    log = install_backoff(cfg, SimpleNamespace(actor=actor, reference=None, critic=None), 1, out=lines.append)
    return log, lines


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], exact: bool = True) -> None:
    assert set(a) == set(b)
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-7, msg=k)


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_halved_budget_redoes_the_update_as_the_small_budget_from_the_start(where):
    """(a) the step completes after one halving; (b) the weights equal, bit for bit, those of a fresh
    engine that used the halved budget from the start; (c) one back-off counted, the new budget shown."""
    cfg = tuned_config(f"{A}.use_dynamic_bsz=true")
    actor, batch = make_actor(budget=64)
    log, lines = watch(cfg, actor)
    failed = inject(actor, lambda tokens, _m: tokens > 30, where)
    before = weights(actor)
    metrics = actor.update(batch, TEMP).metrics
    assert failed == [56]  # the whole batch in one micro-batch, once; the redo splits it 28 + 28 (or so)
    assert actor.train_budget.max_token_len == 32
    after = weights(actor)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the step did train

    ref_actor, ref_batch = make_actor(budget=32)
    ref_metrics = ref_actor.update(ref_batch, TEMP).metrics
    assert_same(after, weights(ref_actor))
    assert metrics["pg_loss"] == ref_metrics["pg_loss"] and metrics["grad_norm"] == ref_metrics["grad_norm"]
    assert log.metrics()["tune/oom_backoffs"] == 1.0
    assert log.metrics()[metric_name(BUDGET)] == 32.0 == float(cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu)
    assert lines == [f"rlforge: out of memory in stage update_actor: {BUDGET} 64 -> 32; redoing the stage's work"]


def test_only_the_failed_optimizer_step_is_redone():
    """Two mini-batches (26 and 30 tokens): the first steps with budget 64; the second runs out of
    memory twice (64, 32) and is redone at 16.  Equal, bit for bit, to an engine that took those two
    steps with those budgets; the optimizer stepped exactly twice."""
    cfg = tuned_config(f"{A}.use_dynamic_bsz=true")
    actor, batch = make_actor(budget=64)
    actor.mini_batch_size = 3
    log, _ = watch(cfg, actor)
    steps = []
    actor.engine.optimizer.register_step_pre_hook(lambda *_: steps.append(1))
    failed = inject(actor, lambda tokens, _m: tokens > 28)
    actor.update(batch, TEMP)
    assert failed == [30, 30] and len(steps) == 2 and [c.after for c in log.changes] == [32, 16]

    ref_actor, ref_batch = make_actor(budget=None)
    ref_actor.mini_batch_size = 3
    inner, budgets = ref_actor.engine.train_step, iter([64, 16])
    ref_actor.engine.train_step = lambda mini, loss_fn, mbs, _mtl: inner(mini, loss_fn, mbs, next(budgets))
    ref_actor.update(ref_batch, TEMP)
    assert_same(weights(actor), weights(ref_actor))


def test_fixed_micro_batches_halve_the_micro_batch_size():
    """Without dynamic batching the micro-batch size halves (6 -> 3 -> 1 here, clamped to one row)."""
    cfg = tuned_config()
    actor, batch = make_actor(budget=None, micro=6)
    log, lines = watch(cfg, actor)
    inject(actor, lambda tokens, _m: tokens > 15)
    actor.update(batch, TEMP)
    assert actor.train_budget.micro_batch_size == 1
    assert [c.after for c in log.changes] == [3, 1] and log.metrics()[metric_name(MICRO)] == 1.0
    ref_actor, ref_batch = make_actor(budget=None, micro=1)
    ref_actor.update(ref_batch, TEMP)
    assert_same(weights(actor), weights(ref_actor))


def test_forward_only_stage_redoes_its_forward():
    """old_log_prob: the log-probs after a back-off equal those of the smaller budget from the start."""
    cfg = tuned_config(f"{A}.use_dynamic_bsz=true", "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=true")
    actor, batch = make_actor(budget=64)
    actor.budget.max_token_len = 64
    log, _ = watch(cfg, actor)
    calls = []
    inner = actor.engine.infer

    def infer(b, fwd, mbs, mtl):
        calls.append(mtl)
        if mtl > 40:
            raise oom()
        return inner(b, fwd, mbs, mtl)

    actor.engine.infer = infer
    out = actor.compute_log_prob(batch, TEMP)["log_probs"]
    assert calls == [64, 32] and log.changes[0].key == "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"
    actor.engine.infer = inner
    actor.budget.max_token_len = 15
    torch.testing.assert_close(out, actor.compute_log_prob(batch, TEMP)["log_probs"], rtol=1e-6, atol=1e-6)


def test_user_set_budget_gives_the_clear_error():
    """(d) a budget the user chose is not changed: oom.py's one-line error, naming the key and why."""
    cfg = tuned_config(f"{A}.use_dynamic_bsz=true", f"{BUDGET}=64")  # checkpointing: on (the default)
    actor, batch = make_actor(budget=64)
    log, lines = watch(cfg, actor)
    inject(actor, lambda tokens, _m: tokens > 30)
    before = weights(actor)
    with pytest.raises(DeviceOutOfMemory) as info:
        with oom_guard("update_actor", cfg, read_memory=lambda: None, note=log.note):
            actor.update(batch, TEMP)
    msg = str(info.value)
    assert "\n" not in msg and isinstance(info.value.__cause__, torch.OutOfMemoryError)
    assert f"lower {BUDGET} (now 64)" in msg
    assert f"online back-off left {BUDGET}=64 alone because you set it" in msg
    assert log.changes == [] and lines == [] and actor.train_budget.max_token_len == 64
    assert_same(before, weights(actor))  # no optimizer step


@pytest.mark.parametrize("dynamic", [True, False], ids=["token-budget", "micro-batch-size"])
def test_at_the_minimum_budget_checkpointing_is_turned_on(dynamic):
    """(e) the budget cannot shrink (the longest row / one row): checkpointing goes on and the update
    is redone, equal to an engine with checkpointing on from the start."""
    over = (f"{A}.use_dynamic_bsz=true",) if dynamic else ()
    cfg = tuned_config(*over, **{CKPT.replace(".", "__"): False})  # the tuner turned checkpointing off
    budget, micro = (15, 6) if dynamic else (None, 1)
    actor, batch = make_actor(budget=budget, micro=micro, switchable=True)
    log, lines = watch(cfg, actor)
    inject(actor, lambda _t, module: not checkpointing_on(module))
    actor.update(batch, TEMP)
    assert checkpointing_on(actor.engine.module) and cfg.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert lines == [f"rlforge: out of memory in stage update_actor: {CKPT} False -> True; redoing the stage's work"]
    assert log.metrics()[metric_name(CKPT)] == 1.0 and log.metrics()["tune/oom_backoffs"] == 1.0
    ref_actor, ref_batch = make_actor(budget=budget, micro=micro, checkpointing=True)
    ref_actor.update(ref_batch, TEMP)
    assert_same(weights(actor), weights(ref_actor))


def test_persistent_oom_ends_with_the_clear_error_after_every_back_off():
    """(f) halvings down to the floor, then checkpointing, then oom.py's error: no loop."""
    cfg = tuned_config(f"{A}.use_dynamic_bsz=true", **{CKPT.replace(".", "__"): False})
    actor, batch = make_actor(budget=64, switchable=True)
    log, lines = watch(cfg, actor)
    failed = inject(actor, lambda _t, _m: True)
    with pytest.raises(DeviceOutOfMemory) as info:
        with oom_guard("update_actor", cfg, read_memory=lambda: None, note=log.note):
            actor.update(batch, TEMP)
    assert [(c.before, c.after) for c in log.changes] == [(64, 32), (32, 16), (16, 15), (False, True)]
    assert len(failed) == 5 and len(lines) == 4
    msg = str(info.value)
    assert "\n" not in msg
    assert (f"online back-off already lowered this stage ({BUDGET} 64 -> 32; {BUDGET} 32 -> 16; {BUDGET} 16 -> 15; "
            f"{CKPT} False -> True) and has nothing left to lower") in msg
    assert f"lower {BUDGET} (now 15)" in msg and f"set {CKPT}=true" not in msg  # the message sees the new values


def test_an_error_after_the_optimizer_began_its_step_is_not_redone():
    """The optimizer's state may have changed: no redo, the clear error, no budget change."""
    cfg = tuned_config(f"{A}.use_dynamic_bsz=true")
    actor, batch = make_actor(budget=64)
    log, _ = watch(cfg, actor)

    def fail(*_):
        raise oom()

    actor.engine.optimizer.register_step_pre_hook(fail)
    with pytest.raises(DeviceOutOfMemory, match="cannot redo an optimizer step that had begun"):
        with oom_guard("update_actor", cfg, read_memory=lambda: None, note=log.note):
            actor.update(batch, TEMP)
    assert log.changes == [] and actor.train_budget.max_token_len == 64


def test_other_errors_and_several_processes_are_not_backed_off():
    cfg = tuned_config(f"{A}.use_dynamic_bsz=true")
    actor, batch = make_actor(budget=64)
    log, _ = watch(cfg, actor)
    inner = actor.log_probs_fn

    def broken(*_):
        raise ValueError("not memory")

    actor.log_probs_fn = broken
    with pytest.raises(ValueError, match="not memory"):
        actor.update(batch, TEMP)
    assert log.changes == []
    actor.log_probs_fn = inner
    many = install_backoff(cfg, SimpleNamespace(actor=actor, reference=None, critic=None), 2)
    assert "several processes" in many.note("update_actor") and many.values == {}


@pytest.mark.e2e
def test_whole_job_backs_off_and_matches_the_smaller_budget(tmp_path, monkeypatch, capsys):
    """`rlforge train` on the tiny preset: the update's forward runs out of memory above 150 tokens;
    the run halves the (unset) budget until it fits and finishes; its two steps equal a run whose
    user set that budget from the start."""
    import json

    from rlforge.cli import main
    from rlforge.roles import actor as actor_module

    inner = actor_module.response_log_probs

    def forward(module, mb, temperature, with_entropy, **kw):
        if torch.is_grad_enabled() and int(mb["attention_mask"].sum()) > 150:
            raise oom()
        return inner(module, mb, temperature, with_entropy, **kw)

    monkeypatch.setattr(actor_module, "response_log_probs", forward)
    base = ["actor_rollout_ref.model.path=preset:tiny", "+actor_rollout_ref.model.override_config.initializer_range=0.2",
            "trainer.device=cpu", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "data.max_response_length=8", "data.max_prompt_length=64",
            "data.builtin.train_size=16", "trainer.total_training_steps=2", "trainer.val_before_train=false",
            "trainer.logger=[file]", f"{A}.use_dynamic_bsz=true"]

    def run(folder: str, *extra: str) -> list[dict]:
        assert main(["train", *base, f"trainer.default_local_dir={tmp_path / folder}", *extra]) == 0
        return [json.loads(x) for x in (tmp_path / folder / "metrics.jsonl").read_text().splitlines()]

    backed = run("auto")
    assert "rlforge: out of memory in stage update_actor: " + BUDGET + " 16384 -> 8192" in capsys.readouterr().err
    final = int(backed[-1][metric_name(BUDGET)])
    assert 72 <= final <= 150 and backed[-1]["tune/oom_backoffs"] >= 1
    assert backed[0]["tune/oom_backoffs"] == backed[-1]["tune/oom_backoffs"]  # all in step 1; step 2 fits
    fixed = run("fixed", f"{BUDGET}={final}")
    assert "tune/oom_backoffs" in fixed[-1] and metric_name(BUDGET) not in fixed[-1]  # the user's key is not watched
    for a, b in zip(backed, fixed, strict=True):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "response_length/mean"):
            assert a[key] == pytest.approx(b[key], rel=1e-6, abs=1e-7), key

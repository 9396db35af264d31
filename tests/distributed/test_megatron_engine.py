"""``strategy=megatron`` (DTensor TP, torch pipelining PP, FSDP2 DP) on gloo against one process.

The tiny fp32 Llama (tied embeddings) and dist_common's 6-row batch; each rank holds its share
of the rows, as under the trainer.  Checked against the single-process model / LocalEngine to
1e-5: log-probs and entropy (vocabulary-parallel, never gathered), the loss metrics of one
mini-batch through the real actor loss (PPO + KL + entropy), every parameter's gradient, the
gradient norm, and after the optimizer step the parameters, the optimizer state and the
log-probs; the full state dict loads into LocalEngine and back into a fresh megatron engine,
and ``sync_to`` gives the rollout copy the same weights.
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
import dist_common as dc  # noqa: E402
import megatron_worker as mw  # noqa: E402

from rlforge.algorithms import loss_agg_globals  # noqa: E402
from rlforge.engine import LossScale  # noqa: E402
from rlforge.engine.staging import metrics_to_floats  # noqa: E402
from rlforge.roles.actor import Actor  # noqa: E402
from rlforge.roles.forward import response_log_probs  # noqa: E402

pytestmark = pytest.mark.e2e

MODE = "seq-mean-token-mean"


@functools.cache
def reference(layers: int = 2) -> dict:
    """The single-process results of the worker's computations (LocalEngine for the step)."""
    model, tok = mw.load_model(layers)
    batch = dc.make_batch(model, tok)
    with torch.no_grad():
        logp0, ent0 = response_log_probs(model.eval(), batch, dc.TEMPERATURE, with_entropy=True)
    model.train()
    actor = Actor(dc.local_engine(model), dc.actor_cfg(MODE), len(batch), len(batch), 2)
    scale = LossScale(**loss_agg_globals(batch["response_mask"].float()))
    loss, _ = actor._loss_fn(dc.TEMPERATURE)(model, batch, scale)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    engine = dc.local_engine(model)
    metrics, logp = dc.run_actor(engine, batch, MODE, micro=2)
    return {"logp_before": logp0, "entropy_before": ent0, "grads": grads, "metrics": metrics, "logp": logp,
            "state": engine.state_dict(), "mask": batch["response_mask"].bool()}


CASES = {
    "tp2": (2, {"tp": 2, "micro": 2}),
    "tp2-sp-ckpt": (2, {"tp": 2, "sp": True, "ckpt": True, "micro": 2}),
    "pp2": (2, {"pp": 2, "micro": 1}),
    "tp2-pp2": (4, {"tp": 2, "pp": 2, "sp": True, "micro": 1}),
    "tp2-dp2": (4, {"tp": 2, "micro": 1}),
    "pp2-dp2": (4, {"pp": 2, "micro": 1}),
    "pp2-vpp2": (2, {"pp": 2, "vpp": 2, "layers": 4, "micro": 1}),
    "pp2-dynamic": (2, {"pp": 2, "micro": 1, "budget": 24}),
}
CRITIC = {"critic": True, "tp": 2, "pp": 2, "sp": True, "micro": 1}  # the value model, on 4 ranks


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Per world size, one launch runs every case of CASES with that many ranks (and, on 4, the
    critic's): one interpreter start per rank instead of one per case (~5-10 s of CPU each).
    Returns the result of a case, or fails its test with the ranks' stderr when the launch
    stopped before that case's result was written."""
    runs: dict[int, tuple] = {}

    def result(world: int, case: str) -> dict:
        if world not in runs:
            cases = {name: {"mode": MODE, **opts} for name, (w, opts) in CASES.items() if w == world}
            if world == 4:
                cases["critic"] = {"mode": MODE, **CRITIC}
            out = tmp_path_factory.mktemp(f"megatron_world{world}")
            error = None
            try:
                mw.launch_cases(world, out, cases, timeout=180.0 * len(cases))
            except RuntimeError as e:  # reported by the tests of the cases without a result
                error = e
            runs[world] = (out, error)
        out, error = runs[world]
        path = out / case / "result.pt"
        if not path.is_file():
            pytest.fail(f"the {world}-rank launch wrote no result for {case}:\n{error}")
        return torch.load(path, weights_only=False)

    return result


def _close_on_tokens(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, atol: float) -> bool:
    """Equal on the response tokens; what a forward leaves after a response's end is not defined
    (the padded forward computes it, the megatron engine's width-trimmed micro-batches do not)."""
    return a.shape == b.shape and torch.allclose(a[mask], b[mask], atol=atol)


def _close_after_first_adam_step(got: dict, want: dict, grads: dict, grad_norm: float, lr: float = 1e-3,
                                 eps: float = 1e-8) -> None:
    """The weights after one AdamW step (``dc.actor_cfg``: lr 1e-3, eps 1e-8, clipping at norm 1).

    The first step moves a weight by ``lr * g / (|g| + eps)`` (``g`` the clipped gradient).  Where
    ``|g| > 1e3 * eps`` that is ``lr * sign(g)`` to within 0.1%, whatever the reduction order, so
    both runs agree to 1e-6; where ``|g|`` is near ``eps`` another reduction order's 1e-7 relative
    gradient differences can move the weight by up to one whole step either way, so the bound there
    is ``2 * lr`` (a weight that is not updated, or updated the wrong way by more, still fails)."""
    assert set(got) == set(want)
    clip = max(grad_norm, 1.0)
    for k, w in want.items():
        diff = (got[k].float() - w.float()).abs()
        g = grads.get(k)
        if g is None:  # a tied weight's second name: no gradient of its own
            assert diff.max() <= 5e-5, (k, diff.max())
            continue
        settled = g.abs() / clip > 1e3 * eps
        assert diff[settled].max() <= 1e-6, (k, diff[settled].max())
        if (~settled).any():
            assert diff[~settled].max() <= 2 * lr, (k, diff[~settled].max())


def _check(r: dict, ref: dict) -> None:
    assert _close_on_tokens(r["logp_before"], ref["logp_before"], ref["mask"], 1e-5)
    assert _close_on_tokens(r["entropy_before"], ref["entropy_before"], ref["mask"], 1e-5)
    m = r["metrics"]
    for k in ("pg_loss", "kl_loss"):
        assert m[k] == pytest.approx(ref["metrics"][k], rel=1e-5, abs=1e-6), k  # TP: other reduction orders
    assert set(r["grads"]) == set(ref["grads"])
    for n, g in ref["grads"].items():
        assert torch.allclose(r["grads"][n], g, atol=1e-5, rtol=1e-5), n
    assert m["grad_norm"] == pytest.approx(ref["metrics"]["grad_norm"], rel=1e-5)
    assert m["grad_norm"] > 1.0  # clipping at 1.0 was active
    _close_after_first_adam_step(r["state"]["model"], ref["state"]["model"], ref["grads"], m["grad_norm"])
    dc.close_optim(r["state"]["optimizer"], ref["state"]["optimizer"])
    assert r["state"]["scheduler"] == ref["state"]["scheduler"]
    assert _close_on_tokens(r["logp"], ref["logp"], ref["mask"], 1e-4)
    dc.close_states(r["synced"], r["state"]["model"], atol=0)
    dc.close_states(r["reloaded_state"]["model"], r["state"]["model"], atol=0)
    dc.close_optim(r["reloaded_state"]["optimizer"], r["state"]["optimizer"])
    local = dc.local_engine(mw.load_model(len({k.split(".")[2] for k in r["grads"] if ".layers." in k}))[0])
    local.load_state_dict(r["state"])  # the megatron checkpoint loads into LocalEngine
    dc.close_states(local.state_dict()["model"], r["state"]["model"], atol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_one_step_matches_single_process(case, launched):
    world, opts = CASES[case]
    r = launched(world, case)
    _check(r, reference(opts.get("layers", 2)))
    em = r["engine_metrics"]
    tp, pp = opts.get("tp", 1), opts.get("pp", 1)
    assert (em["parallel/tp"], em["parallel/pp"], em["parallel/dp"]) == (tp, pp, world // (tp * pp))
    if opts.get("pp", 1) > 1:
        assert 0.0 < em["parallel/pp_bubble"] < 1.0


def test_value_model_matches_single_process(launched):
    """The critic's value head (replicated, fed by the sequence-parallel norm) through TP=2 x PP=2."""
    from rlforge.config import CriticConfig
    from rlforge.models import load_value_model
    from rlforge.roles.critic import Critic

    model, tok = dc.load_model()
    batch = mw.critic_batch(dc.make_batch(model, tok))
    critic_model = load_value_model("preset:tiny", tok, {"initializer_range": 0.2}, seed=3)
    cfg = CriticConfig()
    cfg.loss_agg_mode, cfg.ppo_epochs = MODE, 1
    engine = dc.local_engine(critic_model)
    critic = Critic(engine, cfg, len(batch), len(batch), 2)
    values = critic.compute_values(batch)
    captured = {}

    class Capture:
        lr = 0.0

        def phase(self):  # the engine contract's phase context (param_offload); nothing to move here
            return contextlib.nullcontext()

        def train_step(self, data, loss_fn, micro, budget=None):
            scale = LossScale(**loss_agg_globals(data["response_mask"].float()))
            loss, metrics = loss_fn(critic_model, data, scale)
            captured["metrics"] = metrics_to_floats([metrics])[0]  # as every engine reads them back
            loss.backward()
            return {**captured["metrics"], "grad_norm": 0.0}

    critic.engine = Capture()
    critic.update(batch)
    r = launched(4, "critic")
    assert torch.allclose(r["values"], values, atol=1e-5)
    assert r["metrics"]["vf_loss"] == pytest.approx(captured["metrics"]["vf_loss"], rel=1e-5, abs=1e-6)
    assert set(r["grads"]) == {n for n, _ in critic_model.named_parameters()}
    for n, p in critic_model.named_parameters():
        assert torch.allclose(r["grads"][n], p.grad, atol=1e-5, rtol=1e-5), n

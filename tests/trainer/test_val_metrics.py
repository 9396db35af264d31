"""verl's validation metrics: mean@N, best@k, worst@k, maj@k (bootstrap), their names; one val-only run."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from helpers import SMALL

from rlforge.trainer.val_metrics import (
    bootstrap_metric,
    calc_maj_val,
    group_metrics,
    process_validation_metrics,
    prompt_metrics,
    subset_sizes,
    validation_metric_names,
)


def exact(values: list, k: int, fn) -> float:
    """The expectation that the bootstrap estimates: fn over all len(values)**k ordered draws."""
    return float(np.mean([fn(list(t)) for t in itertools.product(values, repeat=k)]))


def test_calc_maj_val_by_hand() -> None:
    votes = [{"pred": "A", "val": 1.0}, {"pred": "B", "val": 0.0}, {"pred": "A", "val": 0.5}]
    assert calc_maj_val(votes) == 1.0  # "A" wins 2-1; the FIRST "A"'s value
    assert calc_maj_val(votes[1:]) == 0.0  # 1-1 tie: the vote seen first ("B")
    assert calc_maj_val([{"pred": "7", "val": 1}, {"pred": "3", "val": 0}, {"pred": "3", "val": 0}]) == 0


def test_subset_sizes() -> None:
    assert subset_sizes(2) == [2] and subset_sizes(4) == [2, 4] and subset_sizes(5) == [2, 4, 5]
    assert subset_sizes(8) == [2, 4, 8] and subset_sizes(12) == [2, 4, 8, 12]


def test_bootstrap_draws_are_verls() -> None:
    """Same numbers as verl's loop (np.random.seed(42), then one choice(len, k) per resample)."""
    data = [0.1, 0.7, 0.3, 0.9, 0.5]
    state = np.random.get_state()
    try:
        np.random.seed(42)
        lst = []
        for _ in range(1000):
            idx = np.random.choice(len(data), size=3, replace=True)
            lst.append(max(data[i] for i in idx))
        verl = (float(np.mean(lst)), float(np.std(lst)))
    finally:
        np.random.set_state(state)
    ((m, s),) = bootstrap_metric(data, 3, [max], seed=42)
    assert (m, s) == pytest.approx(verl, abs=1e-12)


def test_vectorized_equals_verls_reference() -> None:
    """group_metrics (numpy, draws shared) equals verl's bootstrap_metric + calc_maj_val per variable."""
    rng = np.random.RandomState(0)
    for n in (2, 3, 5, 8):
        vals = rng.rand(n).round(2).tolist()
        acc = [float(v > 0.5) for v in vals]
        preds = [str(int(v * 3)) for v in vals]
        got = group_metrics({"reward": vals, "acc": acc}, preds)
        for var, v in (("reward", vals), ("acc", acc)):
            assert got[var][f"mean@{n}"] == pytest.approx(np.mean(v))
            for k in subset_sizes(n):
                (bm, bs), (wm, ws) = bootstrap_metric(v, k, [np.max, np.min])
                ((mm, ms),) = bootstrap_metric([{"val": x, "pred": p} for x, p in zip(v, preds, strict=True)], k,
                                               [calc_maj_val])
                want = {"best": (bm, bs), "worst": (wm, ws), "maj": (mm, ms)}
                for name, (mean, std) in want.items():
                    assert got[var][f"{name}@{k}/mean"] == pytest.approx(mean, abs=1e-12)
                    assert got[var][f"{name}@{k}/std"] == pytest.approx(std, abs=1e-12)


def test_best_worst_by_hand() -> None:
    """Scores [1, 0, 0, 1]: best@2 = 1 - (1/2)^2 = 0.75, best@4 = 1 - (1/2)^4 = 0.9375; worst the mirror."""
    values = [1.0, 0.0, 0.0, 1.0]
    m = prompt_metrics(values, None)
    assert m["mean@4"] == 0.5 and m["std@4"] == 0.5
    for k, best in ((2, 0.75), (4, 0.9375)):
        assert exact(values, k, max) == best and exact(values, k, min) == 1 - best
        se = np.sqrt(best * (1 - best) / 1000)  # std error of a mean of 1000 Bernoulli draws
        assert abs(m[f"best@{k}/mean"] - best) < 4 * se and abs(m[f"worst@{k}/mean"] - (1 - best)) < 4 * se
        assert m[f"best@{k}/std"] == pytest.approx(np.sqrt(m[f"best@{k}/mean"] * (1 - m[f"best@{k}/mean"])))
    assert not any(k.startswith("maj") for k in m)
    # all responses right / all wrong: the bootstrap is exact
    assert prompt_metrics([1.0] * 4, None)["best@4/mean"] == 1.0 == prompt_metrics([1.0] * 4, None)["worst@2/mean"]
    assert prompt_metrics([0.0] * 3, None)["best@3/std"] == 0.0


def test_maj_by_hand_and_by_enumeration() -> None:
    """Answers 7, 3, 3, 5 (only 7 is right): maj@4 of the full set picks '3' -> 0."""
    values, preds = [1.0, 0.0, 0.0, 0.0], ["7", "3", "3", "5"]
    assert calc_maj_val([{"val": v, "pred": p} for v, p in zip(values, preds, strict=True)]) == 0.0
    m = prompt_metrics(values, preds)
    votes = [{"val": v, "pred": p} for v, p in zip(values, preds, strict=True)]
    for k in (2, 4):
        want = exact(votes, k, calc_maj_val)
        # by hand for k=2: the first draw decides unless the draws are equal, so P(right) = P(first is '7') = 1/4
        if k == 2:
            assert want == 0.25
        se = np.sqrt(want * (1 - want) / 1000)
        assert abs(m[f"maj@{k}/mean"] - want) < 4 * se, (k, m[f"maj@{k}/mean"], want)
    # unanimous answers: maj@k is exact
    assert prompt_metrics([1.0, 1.0, 1.0], ["7", "7", "7"])["maj@3/mean"] == 1.0


def test_process_and_names_like_verl() -> None:
    """Two prompts of one source (all right, all wrong) and one prompt of another, N = 4."""
    srcs = ["a"] * 8 + ["b"] * 4
    uids = [0] * 4 + [1] * 4 + [2] * 4
    infos = {"reward": [1.0] * 4 + [0.0] * 4 + [1.0, 0.0, 0.0, 1.0], "pred": ["1"] * 4 + ["0"] * 4 + list("1001")}
    out = process_validation_metrics(srcs, uids, infos)
    assert set(out) == {"a", "b"} and set(out["a"]) == {"reward"}  # the string variable is not reported
    assert out["a"]["reward"]["mean@4"] == 0.5 and out["a"]["reward"]["best@4/mean"] == 0.5
    assert out["a"]["reward"]["maj@4/mean"] == 0.5 and out["a"]["reward"]["best@4/std"] == 0.0
    names = validation_metric_names(out)
    core = sorted(k for k in names if k.startswith("val-core/a/"))
    assert core == [f"val-core/a/reward/{m}" for m in
                    ("best@4/mean", "best@4/std", "maj@4/mean", "maj@4/std", "mean@4")]
    aux = {k for k in names if k.startswith("val-aux/a/")}
    assert {"val-aux/a/reward/std@4", "val-aux/a/reward/worst@4/mean", "val-aux/a/reward/best@2/mean",
            "val-aux/a/reward/maj@2/mean"} <= aux
    # with an ``acc`` variable, it is the core one (verl)
    names = validation_metric_names(process_validation_metrics(srcs[:4], uids[:4], {"reward": [1.0] * 4,
                                                                                    "acc": [1.0] * 4}))
    assert "val-core/a/acc/mean@4" in names and "val-aux/a/reward/mean@4" in names


@pytest.mark.e2e
def test_val_only_run_reports_at_n(tmp_path: Path) -> None:
    from rlforge.cli import main

    r = "actor_rollout_ref.rollout"
    rc = main(["train", *SMALL, f"trainer.default_local_dir={tmp_path}", "trainer.logger=[file]",
               "trainer.val_only=True", f"{r}.val_kwargs.n=4", f"{r}.val_kwargs.do_sample=True",
               f"{r}.val_kwargs.temperature=1.0"])
    assert rc == 0
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    ds = "val-core/rlforge/arithmetic/reward"
    for name in ("mean@4", "best@4/mean", "best@4/std", "maj@4/mean", "maj@4/std"):
        assert f"{ds}/{name}" in row, name
    assert row[f"{ds}/best@4/mean"] >= row[f"{ds}/mean@4"] >= row["val-aux/rlforge/arithmetic/reward/worst@4/mean"]

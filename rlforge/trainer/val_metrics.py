"""Validation metrics as verl reports them: ``mean@N``, ``std@N``, ``best@k``, ``worst@k``, ``maj@k``.

Source: verl ``verl/trainer/ppo/metric_utils.py`` (``bootstrap_metric``, ``calc_maj_val``,
``process_validation_metrics``) and the naming in ``RayPPOTrainer._validate``
(``verl/trainer/ppo/ray_trainer.py``).  Per prompt, with its ``N`` responses' values ``v``:

* ``mean@N`` = mean(v); ``std@N`` = std(v) (population std, numpy's default), for N > 1;
* for every ``k`` in 2, 4, 8, ... (< N) and N itself: draw ``n_bootstrap`` = 1000 subsets of ``k``
  responses WITH replacement (seed 42) and report ``best@k/mean`` and ``best@k/std`` (mean and std
  of the subsets' max), ``worst@k/{mean,std}`` (of their min) and, when the responses have a
  predicted answer ``pred``, ``maj@k/{mean,std}`` (the value of the first response carrying the
  subset's most frequent ``pred``; ties go to the answer seen first in the subset).

Each metric is then averaged over the prompts of a data source.  The metric's name is
``<section>/<data_source>/<var>/<metric>``, where ``var`` is ``reward`` (the score) or a numeric extra
key of the reward function (``acc``, ...), and ``section`` is ``val-core`` for the core variable
(``acc`` when the reward function returns it, else ``reward``) and the metrics ``mean@N``,
``best@N/*`` and ``maj@N/*`` at the largest N; every other metric (``std@N``, ``worst@N/*``,
smaller k) is ``val-aux``, as in verl.

Deviations from verl, none in the numbers: the random draws come from a local
``numpy.random.RandomState(seed)`` instead of re-seeding numpy's global generator (one
``(n_bootstrap, k)`` call of the legacy generator yields the same stream as verl's ``n_bootstrap``
calls of size ``k``), drawn once per prompt and k and shared by every variable (verl re-seeds per call,
so its draws are these too), and reduced with numpy instead of a Python loop per resample
(:func:`group_metrics`; :func:`bootstrap_metric` and :func:`calc_maj_val` are verl's reference forms,
and the tests check the two agree).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

N_BOOTSTRAP = 1000
SEED = 42


def bootstrap_metric(
    data: Sequence[Any], subset_size: int, reduce_fns: Sequence[Callable[[list[Any]], float]],
    n_bootstrap: int = N_BOOTSTRAP, seed: int = SEED,
) -> list[tuple[float, float]]:
    """``(mean, std)`` over ``n_bootstrap`` subsets of ``subset_size`` items of ``data`` drawn with
    replacement, of each ``reduce_fn(subset)``; verl's ``bootstrap_metric``."""
    rng = np.random.RandomState(seed)
    idx = rng.choice(len(data), size=(n_bootstrap, subset_size), replace=True)
    out = []
    for fn in reduce_fns:
        vals = [fn([data[i] for i in row]) for row in idx]
        out.append((float(np.mean(vals)), float(np.std(vals))))
    return out


def calc_maj_val(data: Sequence[dict[str, Any]], vote_key: str = "pred", val_key: str = "val") -> float:
    """The ``val_key`` of the first item whose ``vote_key`` is the most frequent (verl's ``calc_maj_val``;
    a tie goes to the vote seen first)."""
    vote2vals: dict[Any, list[Any]] = defaultdict(list)
    for d in data:
        vote2vals[d[vote_key]].append(d[val_key])
    best = max(vote2vals, key=lambda k: len(vote2vals[k]))
    return vote2vals[best][0]


def subset_sizes(n: int) -> list[int]:
    """verl's k values for N responses: 2, 4, 8, ... below N, then N."""
    ks, k = [], 2
    while k < n:
        ks.append(k)
        k *= 2
    return ks + [n]


def _majority_picks(idx: np.ndarray, preds: Sequence[Any]) -> np.ndarray:
    """For each row of response indices ``idx`` ``(n_bootstrap, k)``: the first index whose ``pred`` is
    the row's most frequent one (ties: the pred seen first in the row), i.e. the response whose value
    :func:`calc_maj_val` returns.  Shape ``(n_bootstrap,)``."""
    code_of = {p: i for i, p in enumerate(dict.fromkeys(preds))}
    codes = np.asarray([code_of[p] for p in preds], dtype=np.int64)[idx]  # (B, k)
    k = idx.shape[1]
    onehot = codes[:, :, None] == np.arange(len(code_of))  # (B, k, C)
    counts = onehot.sum(axis=1)  # (B, C)
    first = np.where(onehot.any(axis=1), onehot.argmax(axis=1), k)  # (B, C): first position of each pred
    tied = counts == counts.max(axis=1, keepdims=True)
    pos = np.where(tied, first, k).min(axis=1)  # (B,): the earliest of the most frequent
    return idx[np.arange(len(idx)), pos]


def group_metrics(
    var2vals: dict[str, Sequence[float]], preds: Sequence[Any] | None, seed: int = SEED,
) -> dict[str, dict[str, float]]:
    """The metrics of one prompt's N responses, for each variable (``{var: [N values]}``); ``preds``
    (N answers) gives ``maj@k``.  The same numbers as verl's per-variable :func:`bootstrap_metric` calls
    (each of which re-seeds, so every call draws the same ``(n_bootstrap, k)`` indices), drawn once per k
    and reduced with numpy."""
    out: dict[str, dict[str, float]] = {}
    arrays = {var: np.asarray(vals, dtype=np.float64) for var, vals in var2vals.items()}
    n = len(next(iter(arrays.values()))) if arrays else 0
    for var, arr in arrays.items():
        out[var] = {f"mean@{n}": float(np.mean(arr))}
        if n > 1:
            out[var][f"std@{n}"] = float(np.std(arr))
    if n <= 1:
        return out
    for k in subset_sizes(n):
        idx = np.random.RandomState(seed).choice(n, size=(N_BOOTSTRAP, k), replace=True)
        picks = _majority_picks(idx, preds) if preds is not None else None
        for var, arr in arrays.items():
            m, sub = out[var], arr[idx]
            best, worst = sub.max(axis=1), sub.min(axis=1)
            m[f"best@{k}/mean"], m[f"best@{k}/std"] = float(np.mean(best)), float(np.std(best))
            m[f"worst@{k}/mean"], m[f"worst@{k}/std"] = float(np.mean(worst)), float(np.std(worst))
            if picks is not None:
                maj = arr[picks]
                m[f"maj@{k}/mean"], m[f"maj@{k}/std"] = float(np.mean(maj)), float(np.std(maj))
    return out


def prompt_metrics(values: Sequence[float], preds: Sequence[Any] | None, seed: int = SEED) -> dict[str, float]:
    """:func:`group_metrics` of one variable: the metrics of one prompt's N response values."""
    return group_metrics({"v": values}, preds, seed)["v"]


def process_validation_metrics(
    data_sources: Sequence[str], sample_uids: Sequence[Any], infos: dict[str, Sequence[Any]], seed: int = SEED,
) -> dict[str, dict[str, dict[str, float]]]:
    """``{data_source: {var: {metric: value}}}``: :func:`prompt_metrics` of each prompt (samples
    grouped by ``sample_uids``), averaged over the prompts of each data source.  ``infos`` maps a
    variable name to one value per sample; string variables (``pred``) are not reported but
    ``pred`` feeds ``maj@k`` (a prompt with a None ``pred`` gets no ``maj@k``).  verl's ``process_validation_metrics``."""
    groups: dict[str, dict[Any, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, (src, uid) in enumerate(zip(data_sources, sample_uids, strict=True)):
        groups[str(src)][uid].append(i)
    preds = infos.get("pred")
    out: dict[str, dict[str, dict[str, float]]] = {}
    for src, uid2rows in groups.items():
        per_var: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for rows in uid2rows.values():
            var2vals = {var: [float(vals[i]) for i in rows] for var, vals in infos.items()
                        if not (isinstance(vals[rows[0]], str) or vals[rows[0]] is None)}
            group_preds = [preds[i] for i in rows] if preds is not None else None
            if group_preds is not None and any(p is None for p in group_preds):
                group_preds = None  # a response without a ``pred`` entry: no maj@k for this prompt
            for var, metrics in group_metrics(var2vals, group_preds, seed).items():
                for name, v in metrics.items():
                    per_var[var][name].append(v)
        out[src] = {var: {name: float(np.mean(v)) for name, v in ms.items()} for var, ms in per_var.items()}
    return out


def validation_metric_names(src2var2metric: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    """verl's flat names: ``val-core/<ds>/<var>/<metric>`` for the core variable's ``mean``/``maj``/
    ``best`` metrics at the largest N, ``val-aux/...`` for the rest."""
    out: dict[str, float] = {}
    for src, var2metric in src2var2metric.items():
        core_var = "acc" if "acc" in var2metric else "reward"
        for var, metrics in var2metric.items():
            n_max = max(int(name.split("@")[-1].split("/")[0]) for name in metrics)
            for name, value in metrics.items():
                core = var == core_var and name.startswith(("mean", "maj", "best")) and f"@{n_max}" in name
                out[f"{'val-core' if core else 'val-aux'}/{src}/{var}/{name}"] = value
    return out

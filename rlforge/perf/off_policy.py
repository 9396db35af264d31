"""The off-policy section of ``rlforge perf report``: how stale the trained tokens were (partial
rollout, :mod:`rlforge.trainer.partial_rollout`) and what rollout correction did
(:mod:`rlforge.algorithms.rollout_correction`), from the rows of ``metrics.jsonl``.

Per metric, over the training steps that logged it: the mean, the max and the last step's value.
The version-gap histogram (``fully_async/staleness/gap_<k>``: the share of a step's trained tokens
sampled ``k`` policy versions before the one trained) is averaged over those steps.  A run with none
of these metrics gets no section.
"""

from __future__ import annotations

import math

STALENESS_KEYS: tuple[tuple[str, str], ...] = (
    ("fully_async/staleness/off_policy_token_frac", "share of trained tokens sampled by an older policy"),
    ("fully_async/staleness/max_version_gap", "largest version gap of a trained token"),
    ("fully_async/staleness/stale_token_frac", "share of tokens past `max_version_gap` (masked or dropped)"),
    ("fully_async/partial/partial_ratio", "share of trained responses sampled under more than one version"),
    ("fully_async/partial/max_partial_span", "largest version span inside one response"),
    ("fully_async/carried_responses", "unfinished responses carried to the next step"),
    ("fully_async/pool_groups", "prompt groups left in the pool"),
    ("fully_async/dropped_stale_responses", "responses restarted from their prompt (stale_mode=drop)"),
)
"""(metric, what it counts) of the staleness table, in this order."""

GAP_BINS = ("0", "1", "2", "3", "4+")
"""The version-gap histogram's bins (``fully_async/staleness/gap_<bin>``)."""


def _stats(rows: list[dict[str, float]], key: str) -> tuple[float, float, float] | None:
    """(mean, max, last) of ``key`` over the rows that have a finite value; None where none has."""
    vals = [r[key] for r in rows if key in r and math.isfinite(r[key])]
    return (sum(vals) / len(vals), max(vals), vals[-1]) if vals else None


def _num(v: float) -> str:
    return f"{v:.4g}"


def off_policy_section(rows: list[dict[str, float]]) -> list[str]:
    """Markdown lines of the section (empty when no training row has a staleness or ``rollout_corr/``
    metric).  ``rows``: ``metrics.jsonl`` rows, the training ones (with ``timing_s/step``) are used."""
    train = [r for r in rows if "timing_s/step" in r]
    corr = sorted({k for r in train for k in r if k.startswith("rollout_corr/")})
    keys = [(k, what) for k, what in STALENESS_KEYS if any(k in r for r in train)]
    keys += [(k, "rollout correction (verl's metric)") for k in corr]
    if not keys:
        return []
    lines = ["## Off-policy data", "",
             "Partial rollout's staleness and rollout correction, over the training steps that logged each metric.",
             "", "| metric | mean | max | last | what |", "|---|---|---|---|---|"]
    for key, what in keys:
        stats = _stats(train, key)
        if stats is not None:
            lines.append(f"| `{key}` | {' | '.join(_num(v) for v in stats)} | {what} |")
    gaps = [_stats(train, f"fully_async/staleness/gap_{b}") for b in GAP_BINS]
    if any(g is not None for g in gaps):
        lines += ["", "Version gap of the trained tokens (share of a step's tokens, mean over the steps):", "",
                  "| gap | " + " | ".join(GAP_BINS) + " |", "|---|" + "---|" * len(GAP_BINS),
                  "| share | " + " | ".join("-" if g is None else f"{100 * g[0]:.3g}%" for g in gaps) + " |"]
    return lines + [""]

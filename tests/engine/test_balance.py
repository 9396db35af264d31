"""Data-parallel balance: equal row counts, groups kept on one rank, spread never worse
than the naive contiguous split, and verl's ``global_seqlen/*`` metrics on a hand case."""

from __future__ import annotations

import random

import pytest
import torch

from rlforge.engine.balance import balance_across_ranks, balanced_permutation, seqlen_metrics
from rlforge.engine.dynamic_batch import karmarkar_karp


def _sums(lens, parts):
    return [sum(lens[i] for i in p) for p in parts]


def test_balance_hand_case():
    # contiguous split: [100, 100] / [10, 10] -> 200 / 20; balanced: 110 / 110
    lens = [100, 100, 10, 10]
    parts = balance_across_ranks(lens, 2)
    assert sorted(_sums(lens, parts)) == [110, 110]
    assert all(len(p) == 2 for p in parts)


def test_balance_random_cases_keep_groups_and_reduce_spread():
    """100 seeded cases: equal rows per rank, every GRPO group on one rank, and the balanced
    max-min spread <= the contiguous split's (guaranteed by the fallback; KK alone was worse
    in ~2% of such cases, measured over 2000), and strictly smaller where there is a choice."""
    rng = random.Random(0)
    improved = 0
    for _ in range(100):
        world = rng.choice([1, 2, 4, 8])
        group = rng.choice([1, 2, 4, 5])
        n = world * group * rng.randint(1, 6)
        lens = [min(2048, int(64 * rng.paretovariate(1.2))) for _ in range(n)]
        parts = balance_across_ranks(lens, world, group)
        assert len(parts) == world
        assert sorted(i for p in parts for i in p) == list(range(n))
        assert {len(p) for p in parts} == {n // world}
        for p in parts:
            assert {i // group for i in p} == {i // group for i in p if i % group == 0}  # whole groups only
            assert len(p) == len({i // group for i in p}) * group
        chunk = n // world
        naive = [sum(lens[o:o + chunk]) for o in range(0, n, chunk)]
        bal = _sums(lens, parts)
        assert max(bal) - min(bal) <= max(naive) - min(naive)
        improved += max(bal) - min(bal) < max(naive) - min(naive)
    assert improved >= 40  # measured 48: world 1 or one group per rank leaves nothing to improve


def test_contiguous_split_kept_when_kk_is_worse():
    """KK (equal sizes) splits [1, 1, 4, 2, 2, 2] as 5 / 7; the contiguous 6 / 6 is kept."""
    lens = [1, 1, 4, 2, 2, 2]
    assert sorted(_sums(lens, karmarkar_karp(lens, 2, equal_size=True))) == [5, 7]
    assert balance_across_ranks(lens, 2) == [[0, 1, 2], [3, 4, 5]]


def test_balanced_permutation_gives_each_rank_its_rows():
    lens = [5, 50, 6, 60, 7, 70, 8, 80]
    parts = balance_across_ranks(lens, 2, group_size=2)
    perm = balanced_permutation(parts)
    rows = torch.arange(8)[perm]
    assert [rows[:4].tolist(), rows[4:].tolist()] == parts


def test_balance_errors():
    with pytest.raises(ValueError, match="rollout.n"):
        balance_across_ranks([1, 2, 3], 1, group_size=2)
    with pytest.raises(ValueError, match="data-parallel"):
        balance_across_ranks([1, 2, 3, 4, 5, 6], 4, group_size=3)
    with pytest.raises(ValueError, match=">= 1"):
        balance_across_ranks([1, 2], 0)


def test_seqlen_metrics_hand_case():
    lens = [100, 100, 10, 10]
    m = seqlen_metrics(lens, [[0, 2], [1, 3]])
    assert m == {
        "global_seqlen/min": 20.0,
        "global_seqlen/max": 200.0,
        "global_seqlen/minmax_diff": 180.0,
        "global_seqlen/balanced_min": 110.0,
        "global_seqlen/balanced_max": 110.0,
        "global_seqlen/mean": 110.0,
    }
    with pytest.raises(ValueError):
        seqlen_metrics([1], [[0], []])

"""Per-rank metrics combined as the run's: counts summed, maxima and timings maxed, the rest averaged
(rlforge.trainer.spmd.reduce_metrics, with the ranks' dicts given directly instead of gathered)."""

from __future__ import annotations

import rlforge.trainer.spmd as spmd


def test_counts_are_summed_and_the_rest_reduced_by_kind(monkeypatch) -> None:
    ranks = [
        {"reward/timeouts": 2.0, "reward/errors": 0.0, "reward/judge_parse_failures": 3.0, "perf/total_num_tokens": 10.0,
         "critic/score/mean": 0.5, "response_length/max": 7.0, "response_length/min": 2.0, "timing_s/gen": 1.0},
        {"reward/timeouts": 1.0, "reward/errors": 4.0, "reward/judge_parse_failures": 0.0, "perf/total_num_tokens": 30.0,
         "critic/score/mean": 0.25, "response_length/max": 9.0, "response_length/min": 1.0, "timing_s/gen": 3.0},
    ]
    monkeypatch.setattr(spmd, "gather_objects", lambda m: ranks)
    out = spmd.reduce_metrics(ranks[0])
    assert out == {"reward/timeouts": 3.0, "reward/errors": 4.0, "reward/judge_parse_failures": 3.0,
                   "perf/total_num_tokens": 40.0, "critic/score/mean": 0.375, "response_length/max": 9.0,
                   "response_length/min": 1.0, "timing_s/gen": 3.0}


def test_one_rank_is_unchanged(monkeypatch) -> None:
    m = {"reward/timeouts": 2.0, "critic/score/mean": 0.5}
    monkeypatch.setattr(spmd, "gather_objects", lambda x: [x])
    assert spmd.reduce_metrics(m) == m

"""benchmarks/longtail.py: the long-tail length generator gives the lengths it promises."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "longtail.py"
_spec = importlib.util.spec_from_file_location("longtail", _PATH)
longtail = importlib.util.module_from_spec(_spec)
sys.modules["longtail"] = longtail
_spec.loader.exec_module(longtail)


def test_norm_ppf_against_erf() -> None:
    """The quantile function inverts Phi(x) = (1 + erf(x / sqrt 2)) / 2 (math.erf, independent)."""
    p = np.array([1e-6, 0.001, 0.02, 0.1, 0.3, 0.5, 0.77, 0.975, 0.99, 0.999999])
    x = longtail._norm_ppf(p)
    back = np.array([(1 + math.erf(v / math.sqrt(2))) / 2 for v in x])
    np.testing.assert_allclose(back, p, rtol=1e-7)
    assert abs(longtail._norm_ppf(np.array([0.99]))[0] - longtail.Z99) < 1e-8


@pytest.mark.parametrize("n", [256, 1024, 4096])
@pytest.mark.parametrize(("mean", "p99", "max_len"), [(500, 3000, 4096), (200, 1500, 2048), (800, 2500, 8192)])
def test_lengths_keep_their_promise(n: int, mean: float, p99: float, max_len: int) -> None:
    dist = longtail.LongTail(mean=mean, p99=p99, max_len=max_len)
    lengths = dist.sample(n, seed=n)
    assert lengths.dtype == np.int64 and lengths.shape == (n,)
    assert lengths.min() >= 1 and lengths.max() <= max_len
    assert abs(lengths.mean() - mean) / mean < 0.01
    assert abs(np.percentile(lengths, 99) - p99) / p99 < 0.05
    # a long tail, not a constant: the median sits well below the mean, and the top rows run long
    assert np.median(lengths) < 0.9 * mean
    assert lengths.max() > 0.9 * p99


def test_the_tail_reaches_the_limit_at_4096() -> None:
    """The issue's workload: mean ~500, max 4096; with 1024 rows a few hit the clip."""
    lengths = longtail.LongTail(mean=500, p99=3000, max_len=4096).sample(1024, seed=0)
    assert lengths.max() == 4096
    assert 1 <= (lengths == 4096).sum() <= 10


def test_seeded_and_shuffled() -> None:
    dist = longtail.LongTail()
    a, b, c = dist.sample(512, seed=1), dist.sample(512, seed=1), dist.sample(512, seed=2)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.all(np.diff(a) >= 0)  # not left sorted by stratum


@pytest.mark.parametrize("kw", [dict(mean=500, p99=400), dict(mean=100, p99=5000, max_len=8192),
                                dict(mean=500, p99=5000, max_len=4096), dict(mean=0.5, p99=10)])
def test_impossible_distributions_refused(kw: dict) -> None:
    with pytest.raises(ValueError):
        longtail.LongTail(**kw)


# ---------------------------------------------------------------------------- e2e_grpo --lengths lognormal
def test_lognormal_from_clip_meets_its_two_numbers():
    mu, sigma = longtail.lognormal_from_clip(1024)
    assert math.exp(mu + sigma ** 2 / 2) == pytest.approx(0.37 * 1024, rel=1e-6)  # the unclipped mean
    z95 = 1.6448536269514722
    assert math.exp(mu + z95 * sigma) == pytest.approx(1024, rel=1e-6)  # 5 % above the maximum
    with pytest.raises(ValueError):
        longtail.lognormal_from_clip(1024, mean_fraction=0.001, clip_fraction=0.45)


def test_drawn_lengths_are_seeded_per_prompt_and_sample():
    a = longtail.drawn_length([5, 6, 7], 3, 1024, seed=0)
    assert a == longtail.drawn_length([5, 6, 7], 3, 1024, seed=0)  # the same in every process
    draws = {longtail.drawn_length([5, 6, 7], j, 1024, seed=0) for j in range(16)}
    assert len(draws) > 8  # samples of one prompt differ
    assert longtail.drawn_length([5, 6, 7], 3, 1024, seed=1) != a or longtail.drawn_length([5, 6, 8], 3, 1024) != a


def test_drawn_length_quantiles_follow_the_lognormal():
    mu, sigma = longtail.lognormal_from_clip(1024)
    x = np.array([longtail.drawn_length([i, i + 1], j, 1024) for i in range(1000) for j in range(8)])
    assert x.min() >= 1 and x.max() == 1024
    assert (x == 1024).mean() == pytest.approx(0.05, abs=0.01)  # the clipped share
    for q, z in ((0.5, 0.0), (0.25, -0.6744897501960817), (0.9, 1.2815515655446004)):
        assert np.quantile(x, q) == pytest.approx(math.exp(mu + z * sigma), rel=0.05)


def test_response_length_hook_reads_the_environment(monkeypatch):
    monkeypatch.setenv("LONGTAIL_MAX_LEN", "64")
    monkeypatch.setenv("LONGTAIL_SEED", "2")
    assert longtail.response_length([1, 2], 0) == longtail.drawn_length([1, 2], 0, 64, seed=2)


def test_hf_generate_gets_the_same_lengths_as_the_native_engine(tiny_model, tiny_tokenizer, monkeypatch) -> None:
    """TRL's rows of ``e2e_grpo.py --lengths lognormal`` (HF ``generate`` + :class:`ForcedLengths`) end at the
    lengths the native engine's hook gives rlforge's rows for the same prompts and sample indices."""
    import torch

    from rlforge.batch import Batch
    from rlforge.rollout import SamplingParams
    from rlforge.rollout.native import NativeRollout
    from rlforge.rollout.native.forced_eos import ENV

    max_len, n = 24, 3
    prompts = [[5, 9, 13], [7, 8, 100, 200, 3]]
    monkeypatch.setenv(ENV, f"{_PATH}:response_length")
    monkeypatch.setenv("LONGTAIL_MAX_LEN", str(max_len))
    eos, pad = tiny_tokenizer.eos_token_id, tiny_tokenizer.pad_token_id
    rows = [p for p in prompts for _ in range(n)]
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in rows])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in rows])[:, None]).long()
    expected = [longtail.drawn_length(p, j % n, max_len) for j, p in enumerate(rows)]
    assert len(set(expected)) > 2  # the lengths differ (the check could fail)

    native = NativeRollout(tiny_model, [eos], pad, torch.device("cpu"), progress=False, seed=0)
    native.generate(Batch.from_dict({"input_ids": ids, "attention_mask": mask}, {}),
                    SamplingParams(do_sample=True, max_new_tokens=max_len))
    assert [len(s.output_ids) for s in native.last_sequences] == expected

    longtail.generate_with_lengths(tiny_model, eos, pad, max_len)
    try:
        out = tiny_model.generate(input_ids=ids, attention_mask=mask, do_sample=True, max_new_tokens=max_len,
                                  eos_token_id=eos, pad_token_id=pad)
    finally:
        del tiny_model.generate  # the fixture's model is shared: back to the class's generate
    new = out[:, width:].tolist()
    lengths = [next((i + 1 for i, t in enumerate(r) if t == eos), len(r)) for r in new]
    assert lengths == expected

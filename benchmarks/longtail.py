"""Long-tailed response lengths for rollout benchmarks.

Real GRPO batches do not end together: most responses are short and a few run to the length
limit, so the last few percent of sequences decode alone at long context.  This module draws
such lengths from a lognormal distribution given by its **mean** and its **99th percentile**,
clipped to ``[min_len, max_len]``:

    X = exp(mu + sigma Z),  Z ~ N(0, 1)
    mean = exp(mu + sigma^2 / 2),  p99 = exp(mu + z99 sigma),  z99 = Phi^-1(0.99) = 2.3263

so ``sigma`` solves ``sigma^2 / 2 - z99 sigma + ln(p99 / mean) = 0`` (the smaller root; it
exists for ``p99 / mean <= exp(z99^2 / 2)``, about 14.9).  Clipping at ``max_len`` removes some
mass from the tail, so ``mu`` is then re-solved (bisection) so that the clipped lengths keep the
stated mean.

The draw is *stratified*: length ``i`` is the distribution's quantile at a jittered point of
the ``i``-th of ``n`` equal probability strata, then the lengths are shuffled.  The sample's
empirical distribution therefore follows the stated one closely even for a few hundred rows
(mean within 1 %, p99 within 5 % for n >= 256: ``tests/benchmarks/test_longtail.py``), and the
same ``(n, seed)`` always gives the same lengths.

Lengths are enforced per sequence by the caller (a per-row ``max_new_tokens`` with EOS off, or
a forced EOS at the chosen position): see ``benchmarks/rollout_throughput.py``'s ``longtail``
workload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z99 = 2.3263478740408408  # Phi^-1(0.99)


def _norm_ppf(p: np.ndarray) -> np.ndarray:
    """Standard normal quantile (Acklam's rational approximation, relative error < 1.2e-9)."""
    a = [-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02, 1.383577518672690e02,
         -3.066479806614716e01, 2.506628277459239e00]
    b = [-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02, 6.680131188771972e01,
         -1.328068155288572e01]
    c = [-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00, -2.549732539343734e00,
         4.374664141464968e00, 2.938163982698783e00]
    d = [7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00]
    p = np.asarray(p, dtype=np.float64)
    out = np.empty_like(p)
    lo, hi = p < 0.02425, p > 1 - 0.02425
    mid = ~(lo | hi)
    q = p[mid] - 0.5
    r = q * q
    out[mid] = ((((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
                (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1))
    for sel, sign, pp in ((lo, 1.0, p[lo]), (hi, -1.0, 1 - p[hi])):
        q = np.sqrt(-2 * np.log(pp))
        out[sel] = sign * ((((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
                           ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1))
    return out


@dataclass(frozen=True)
class LongTail:
    """A clipped lognormal length distribution.

    ``mean``: mean response length in tokens (after clipping); ``p99``: its 99th percentile
    (before clipping; ``p99 < max_len`` keeps it unchanged by the clip); ``max_len``, ``min_len``:
    the clip range in tokens.  Raises ValueError for an impossible combination.
    """

    mean: float = 500.0
    p99: float = 3000.0
    max_len: int = 4096
    min_len: int = 1

    def __post_init__(self) -> None:
        if not (1 <= self.min_len <= self.mean < self.p99 < self.max_len):
            raise ValueError(f"long-tail lengths need 1 <= min_len <= mean < p99 < max_len, got min_len={self.min_len}"
                             f" mean={self.mean} p99={self.p99} max_len={self.max_len}")
        if math.log(self.p99 / self.mean) > Z99 ** 2 / 2:
            raise ValueError(f"a lognormal with mean {self.mean} cannot have p99 {self.p99}: p99 / mean must be "
                             f"<= {math.exp(Z99 ** 2 / 2):.1f}")

    @property
    def sigma(self) -> float:
        return Z99 - math.sqrt(Z99 ** 2 - 2 * math.log(self.p99 / self.mean))

    def _lengths(self, z: np.ndarray, mu: float) -> np.ndarray:
        return np.clip(np.rint(np.exp(mu + self.sigma * z)), self.min_len, self.max_len).astype(np.int64)

    def sample(self, n: int, seed: int = 0) -> np.ndarray:
        """``n`` lengths (int64, shuffled), stratified as the module docstring says."""
        if n < 1:
            raise ValueError(f"need n >= 1 lengths, got {n}")
        rng = np.random.default_rng(seed)
        z = _norm_ppf((np.arange(n) + rng.uniform(0.05, 0.95, n)) / n)
        mu0 = math.log(self.mean) - self.sigma ** 2 / 2
        lo, hi = mu0 - 1.0, mu0 + 1.0  # the clipped mean rises with mu: bisect it to the stated mean
        for _ in range(60):
            mid = (lo + hi) / 2
            if self._lengths(z, mid).mean() < self.mean:
                lo = mid
            else:
                hi = mid
        lengths = self._lengths(z, (lo + hi) / 2)
        return lengths[rng.permutation(n)]


def describe(lengths: np.ndarray) -> str:
    """``mean 500, p50 .., p99 .., max ..`` of a length sample (for benchmark tables)."""
    q = np.percentile(lengths, [50, 99])
    return f"mean {lengths.mean():.0f}, p50 {q[0]:.0f}, p99 {q[1]:.0f}, max {lengths.max()}"


# ---------------------------------------------------------------------------- e2e GRPO (--lengths lognormal)
# Math-reasoning RL response lengths, as fractions of the run's maximum response length.  Source, from
# memory of the DeepScaleR write-up (Luo et al., "DeepScaleR: Surpassing O1-Preview with a 1.5B Model by
# Scaling RL", Feb 2025; not re-checked against the page): in its 8K-context stage the mean response length
# sat near 3,000 tokens of 8,192 (~0.37 of the maximum) and a few percent of the responses (~5 %) ran into
# the 8K limit.  DAPO (Yu et al., 2025) shows the same shape at a larger scale (mean ~4-5K of ~20K late in
# training, a tail to the limit).  A lognormal with those two numbers: mean = 0.37 L, P(X > L) = 0.05.
DEEPSCALER_MEAN_FRACTION = 0.37
DEEPSCALER_CLIP_FRACTION = 0.05
Z95 = 1.6448536269514722  # Phi^-1(0.95)


def lognormal_from_clip(max_len: int, mean_fraction: float = DEEPSCALER_MEAN_FRACTION,
                        clip_fraction: float = DEEPSCALER_CLIP_FRACTION) -> tuple[float, float]:
    """``(mu, sigma)`` of the lognormal whose (unclipped) mean is ``mean_fraction * max_len`` and whose
    upper ``clip_fraction`` lies above ``max_len``:  ``mean = exp(mu + sigma^2 / 2)``,
    ``max_len = exp(mu + z sigma)`` with ``z = Phi^-1(1 - clip_fraction)``, so ``sigma`` is the smaller root
    of ``sigma^2 / 2 - z sigma - ln(mean_fraction) = 0``.  Raises ValueError where no root exists."""
    if not (0 < mean_fraction < 1 and 0 < clip_fraction < 0.5 and max_len >= 1):
        raise ValueError(f"need 0 < mean_fraction < 1, 0 < clip_fraction < 0.5, max_len >= 1; got {mean_fraction}, "
                         f"{clip_fraction}, {max_len}")
    z = float(-_norm_ppf(np.array([clip_fraction]))[0])
    disc = z * z + 2 * math.log(mean_fraction)
    if disc < 0:
        raise ValueError(f"no lognormal has mean {mean_fraction} x max with {clip_fraction} above the max")
    sigma = z - math.sqrt(disc)
    return math.log(max_len) - z * sigma, sigma


def prompt_key(prompt_ids: list[int]) -> int:
    """A stable 32-bit key of a prompt's token ids (the same in every framework and process)."""
    import zlib

    return zlib.crc32(np.asarray(prompt_ids, dtype=np.int64).tobytes())


def drawn_length(prompt_ids: list[int], sample_index: int, max_len: int, seed: int = 0,
                 mean_fraction: float = DEEPSCALER_MEAN_FRACTION,
                 clip_fraction: float = DEEPSCALER_CLIP_FRACTION) -> int:
    """The response length (tokens, EOS included, in ``[1, max_len]``) of sample ``sample_index`` of the
    prompt ``prompt_ids``: ``round(exp(mu + sigma Z))`` clipped, ``Z`` a standard normal seeded by
    ``(seed, prompt_key(prompt_ids), sample_index)``, ``(mu, sigma)`` from :func:`lognormal_from_clip`."""
    mu, sigma = lognormal_from_clip(max_len, mean_fraction, clip_fraction)
    z = np.random.default_rng([seed, prompt_key(prompt_ids), sample_index]).standard_normal()
    return int(min(max(round(math.exp(mu + sigma * z)), 1), max_len))


def response_length(prompt_ids: list[int], sample_index: int) -> int:
    """The test hook ``RLFORGE_TEST_RESPONSE_LENGTHS=benchmarks/longtail.py:response_length`` (see
    :mod:`rlforge.rollout.native.forced_eos`): :func:`drawn_length` with ``max_len`` and ``seed`` from
    the environment (``LONGTAIL_MAX_LEN``, ``LONGTAIL_SEED``, set by ``e2e_grpo.py --lengths lognormal``)."""
    import os

    return drawn_length(prompt_ids, sample_index, int(os.environ["LONGTAIL_MAX_LEN"]),
                        int(os.environ.get("LONGTAIL_SEED", "0")))


class ForcedLengths:
    """A ``transformers`` logits processor that imposes :func:`drawn_length` on one ``model.generate`` call, as
    the native engine's hook (:mod:`rlforge.rollout.native.forced_eos`) does for rlforge, so that TRL's rows
    of ``e2e_grpo.py --lengths lognormal`` get the same lengths: row ``r``'s ``L``-th new token is forced to
    ``eos_id`` (every other logit -inf), ``L = drawn_length(prompt ids of r, sample index of r, max_len,
    seed)``.  The prompt ids are the row's ``input_ids`` at the first call, without the left padding
    (``pad_id``); the sample index is the row's rank among the rows with the same prompt (TRL repeats each
    prompt ``num_generations`` times in a generation batch).  One instance per ``generate`` call
    (:func:`generate_with_lengths`).  ``__call__(input_ids (batch, seq) int64, scores (batch, vocab) float)``.
    """

    def __init__(self, eos_id: int, pad_id: int, max_len: int, seed: int = 0) -> None:
        self.eos_id, self.pad_id, self.max_len, self.seed = eos_id, pad_id, max_len, seed
        self.start: int | None = None
        self.lengths: list[int] = []

    def _begin(self, input_ids) -> None:
        import sys
        from pathlib import Path

        root = str(Path(__file__).resolve().parents[1])
        if root not in sys.path:
            sys.path.insert(0, root)
        from rlforge.rollout.native.forced_eos import sample_indices

        prompts = []
        for row in input_ids.tolist():
            i = 0
            while i < len(row) and row[i] == self.pad_id:
                i += 1
            prompts.append(row[i:])
        self.start = input_ids.shape[1]
        self.lengths = [drawn_length(p, j, self.max_len, self.seed)
                        for p, j in zip(prompts, sample_indices(prompts, None), strict=True)]

    def __call__(self, input_ids, scores):
        if self.start is None:
            self._begin(input_ids)
        new = input_ids.shape[1] - self.start  # tokens generated so far
        for r, length in enumerate(self.lengths):
            if new == length - 1:
                scores[r, :] = float("-inf")
                scores[r, self.eos_id] = 0.0
        return scores


def generate_with_lengths(model, eos_id: int, pad_id: int, max_len: int, seed: int = 0) -> None:
    """Make ``model.generate`` impose :class:`ForcedLengths` (a fresh one per call) on every call."""
    from transformers import LogitsProcessorList

    original = model.generate

    def generate(*args, **kwargs):
        procs = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        procs.append(ForcedLengths(eos_id, pad_id, max_len, seed))
        return original(*args, logits_processor=procs, **kwargs)

    model.generate = generate

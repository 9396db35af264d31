"""Rollout correction: truncated importance weights and rejection masks between the behaviour
policy that sampled the responses (the rollout engine, ``rollout_log_probs``) and the policy the
trainer scores them with (``old_log_probs``), as verl's ``algorithm.rollout_correction``.

Sources: verl ``docs/algo/rollout_corr.md`` and ``docs/algo/rollout_corr_math.md``; Liu, Li, Fu,
Wang, Liu, Shen (2025), "When Speed Kills Stability: Demystifying RL Collapse from the
Training-Inference Mismatch" (https://richardli.xyz/rl-collapse); Ionides (2008), truncated
importance sampling.

Notation, per valid response token ``t`` of sequence ``i`` (tensors ``(batch, response_len)``,
log-probs in nats, float32):

* ``log r_t = log pi_old(a_t) - log pi_rollout(a_t)`` (the log importance ratio);
* token weight ``w_t = min(exp(clamp(log r_t, -20, 20)), C)``; sequence weight
  ``w_i = min(exp(clamp(sum_t log r_t, -20, 20)), C)``, broadcast over the sequence's tokens
  (``C`` = ``rollout_is_threshold``); weights are 0 on padding and carry no gradient;
* rejection statistics per token: ``k1 = -log r``, ``k2 = 0.5 (log r)^2``, ``k3 = r - 1 - log r``,
  aggregated per sequence as a sum, mean or max.  A ``k1`` criterion keeps values inside
  ``[log lower, log upper]`` of the ratio bounds; ``k2``/``k3`` keep values ``<= upper``.  Every
  criterion must pass; a failing sequence statistic drops the whole sequence.

Deviation from verl: the per-sequence metrics (``rollout_is_seq_*``) are over sequences with at
least one valid token (verl also averages in the empty ones as 0); a smaller set of per-criterion
rejection metrics is logged (``_mean``, ``_max``, ``_min``, ``_fraction_high``, ``_fraction_low``,
``_masked_fraction``, ``_seq_masked_fraction``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from rlforge.config.rollout_correction_check import Bounds, parse_rs_options, parse_rs_thresholds

from .utils import masked_mean, masked_sum

SAFETY_BOUND = 20.0
"""Log-ratios are clamped to ``[-20, 20]`` before ``exp`` (as verl): a weight stays below ~4.9e8."""

Metrics = dict[str, torch.Tensor]
"""Metric name (without the ``rollout_corr/`` prefix) -> 0-d detached tensor."""
SumOverRanks = Callable[[torch.Tensor], torch.Tensor]
"""Sums a small tensor over the data-parallel ranks (the identity on one process)."""


@dataclass
class Correction:
    """Result of :func:`compute_rollout_correction`.

    Attributes:
        weights: ``(batch, response_len)`` truncated importance weights (0 on padding), or None
            when ``rollout_is`` is null.
        response_mask: ``(batch, response_len)``, the input mask with rejected tokens set to 0
            (same dtype as the input).
        metrics: ``rollout_corr/<name>`` -> 0-d tensor (verl's names).
    """

    weights: torch.Tensor | None
    response_mask: torch.Tensor
    metrics: Metrics = field(default_factory=dict)


def _sum_over_ranks(x: torch.Tensor) -> torch.Tensor:
    return x


def is_weights(log_ratio: torch.Tensor, mask: torch.Tensor, level: str, threshold: float,
               batch_normalize: bool = False, sum_over_ranks: SumOverRanks = _sum_over_ranks,
               ) -> tuple[torch.Tensor, Metrics]:
    """Truncated importance weights (TIS) and their metrics.

    Args:
        log_ratio: ``(B, R)`` ``log pi_old - log pi_rollout`` (nats; any value at padding).
        mask: ``(B, R)`` 1 on valid response tokens.
        level: ``token`` (one weight per token) or ``sequence`` (one per sequence: the product).
        threshold: upper bound ``C`` of the weights (> 0).
        batch_normalize: divide the truncated weights by their mean (over valid tokens for
            ``token``, over sequences with a valid token for ``sequence``), summed over ranks.
    Returns:
        ``(weights, metrics)``: weights ``(B, R)`` float32 without grad, 0 at padding; metrics
        computed before truncation (``rollout_is_mean/max/min/std``, ``_eff_sample_size``,
        ``_ratio_fraction_high/low``, ``rollout_is_seq_*``, ``_batch_norm_factor``).
    """
    log_ratio, mask = log_ratio.detach().float(), mask.float()
    if level == "token":
        log_w = log_ratio
    else:
        log_w = masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)
    raw = torch.exp(log_w.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
    metrics = _is_metrics(raw, log_w, mask, level, threshold)
    weights = raw.clamp(max=threshold)
    if batch_normalize:
        if level == "token":
            stats = torch.stack([(weights * mask).sum(), mask.sum()])
        else:
            valid = (mask.sum(-1) > 0).float()
            seq_w = masked_mean(weights, mask, dim=-1)
            stats = torch.stack([(seq_w * valid).sum(), valid.sum()])
        total, count = sum_over_ranks(stats).unbind()
        mean = total / count.clamp_min(1.0)
        factor = torch.where(mean > 1e-8, mean, torch.ones_like(mean))
        weights = weights / factor
        metrics["rollout_is_batch_norm_factor"] = factor
    return weights, metrics


def _is_metrics(raw: torch.Tensor, log_w: torch.Tensor, mask: torch.Tensor, level: str,
                threshold: float) -> Metrics:
    """verl's ``rollout_is_*`` metrics of the untruncated weights ``raw`` (``(B, R)``, 0 at padding)."""
    keep = mask.bool()
    valid = keep.any(-1)
    lower = 1.0 / threshold
    m: Metrics = {"rollout_is_mean": masked_mean(raw.clamp(max=threshold), mask)}
    if level == "sequence":
        seq_log = log_w[:, 0][valid] if log_w.shape[1] else log_w.new_zeros(0)
        m["rollout_is_max"] = torch.exp(seq_log.max().clamp(max=SAFETY_BOUND))
        m["rollout_is_min"] = torch.exp(seq_log.min())
        m["rollout_is_ratio_fraction_high"] = (seq_log > math.log(threshold)).float().mean()
        m["rollout_is_ratio_fraction_low"] = (seq_log < math.log(lower)).float().mean()
    else:
        m["rollout_is_max"] = raw[keep].max()
        m["rollout_is_min"] = raw[keep].min()
        m["rollout_is_ratio_fraction_high"] = masked_mean((raw > threshold).float(), mask)
        m["rollout_is_ratio_fraction_low"] = masked_mean((raw < lower).float(), mask)
    bounded = raw.clamp(lower, threshold)
    mean_b = masked_mean(bounded, mask)
    m["rollout_is_std"] = (masked_mean(bounded.square(), mask) - mean_b.square()).clamp_min(0.0).sqrt()
    m["rollout_is_eff_sample_size"] = 1.0 / masked_mean((bounded / (mean_b + 1e-8)).square(), mask)
    seq = masked_mean(raw, mask, dim=-1)[valid]
    m["rollout_is_seq_mean"] = seq.mean()
    m["rollout_is_seq_std"] = seq.std() if seq.numel() > 1 else seq.new_zeros(())
    m["rollout_is_seq_max"] = seq.max()
    m["rollout_is_seq_min"] = seq.min()
    m["rollout_is_seq_max_deviation"] = (seq - 1.0).abs().max()
    m["rollout_is_seq_fraction_high"] = (seq > threshold).float().mean()
    m["rollout_is_seq_fraction_low"] = (seq < lower).float().mean()
    return m


def rs_statistic(log_ratio: torch.Tensor, mask: torch.Tensor, option: str) -> torch.Tensor:
    """The statistic criterion ``option`` thresholds: ``(B, R)`` for ``token_*``, ``(B,)`` for
    ``seq_{sum,mean,max}_*`` (0 for a sequence without valid tokens)."""
    lr = log_ratio.detach().float().clamp(-SAFETY_BOUND, SAFETY_BOUND)
    kind = option[-2:]
    per_token = -lr if kind == "k1" else 0.5 * lr.square() if kind == "k2" else torch.exp(lr) - 1.0 - lr
    if option.startswith("token_"):
        return per_token
    if option.startswith("seq_sum_"):
        return masked_sum(per_token, mask, dim=-1)
    if option.startswith("seq_mean_"):
        return masked_mean(per_token, mask, dim=-1)
    top = per_token.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(top), torch.zeros_like(top), top)


def rejection_mask(log_ratio: torch.Tensor, mask: torch.Tensor, bounds: dict[str, Bounds]) -> tuple[torch.Tensor, Metrics]:
    """The response mask with every token or sequence that fails a criterion set to 0.

    Args:
        log_ratio: ``(B, R)`` ``log pi_old - log pi_rollout``.
        mask: ``(B, R)`` 1 on valid response tokens (any dtype; the result keeps it).
        bounds: criterion -> :class:`Bounds` (:func:`parse_rs_thresholds`), all must pass.
    Returns:
        ``(mask, metrics)``: metrics ``rollout_rs_<criterion>_{mean,max,min,fraction_high,
        fraction_low,masked_fraction,seq_masked_fraction}`` and ``rollout_rs_masked_fraction``,
        ``rollout_rs_seq_masked_fraction`` (fractions of valid tokens / of all sequences).
    """
    valid_tok = mask.float()
    keep = torch.ones_like(valid_tok)
    m: Metrics = {}
    for option, b in bounds.items():
        stat = rs_statistic(log_ratio, valid_tok, option)
        low = stat < b.lower if b.lower is not None else torch.zeros_like(stat, dtype=torch.bool)
        high = stat > b.upper
        ok = ~(low | high)
        ok_tok = ok if ok.dim() == 2 else ok.unsqueeze(-1).expand_as(valid_tok)
        keep = keep * ok_tok.float()
        m.update(_rs_metrics(f"rollout_rs_{option}", stat, low, high, ok_tok, valid_tok))
    m["rollout_rs_masked_fraction"] = masked_mean(1.0 - keep, valid_tok)
    m["rollout_rs_seq_masked_fraction"] = ((keep < 0.5) & valid_tok.bool()).any(-1).float().mean()
    return (mask * keep.to(mask.dtype)).to(mask.dtype), m


def _rs_metrics(prefix: str, stat: torch.Tensor, low: torch.Tensor, high: torch.Tensor, ok_tok: torch.Tensor,
                valid_tok: torch.Tensor) -> Metrics:
    seq_valid = valid_tok.sum(-1) > 0
    if stat.dim() == 2:
        sel = valid_tok.bool()
        vals, low_f, high_f = stat[sel], masked_mean(low.float(), valid_tok), masked_mean(high.float(), valid_tok)
    else:
        vals, low_f, high_f = stat[seq_valid], low[seq_valid].float().mean(), high[seq_valid].float().mean()
    return {
        f"{prefix}_mean": vals.mean(), f"{prefix}_max": vals.max(), f"{prefix}_min": vals.min(),
        f"{prefix}_fraction_high": high_f, f"{prefix}_fraction_low": low_f,
        f"{prefix}_masked_fraction": masked_mean(1.0 - ok_tok.float(), valid_tok),
        f"{prefix}_seq_masked_fraction": (~ok_tok & valid_tok.bool()).any(-1)[seq_valid].float().mean(),
    }


def offpolicy_metrics(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor) -> Metrics:
    """verl's off-policy diagnostics: ``kl`` (``E[log pi_rollout - log pi_old]``, nats/token),
    ``k3_kl`` (``E[r - 1 - log r]``), ``training_ppl``/``rollout_ppl`` (batch mean of per-sequence
    perplexities) and their logs, ``log_ppl_diff`` (mean, ``_abs_diff``, ``_max``, ``_min``),
    ``ppl_ratio``, ``chi2_token`` (``E[r^2] - 1``) and ``chi2_seq`` (``E[(prod r)^2] - 1``).
    Inputs ``(B, R)``; only sequences with a valid token count in per-sequence statistics."""
    old, roll, mask = old_log_prob.detach().float(), rollout_log_prob.detach().float(), mask.float()
    valid = mask.sum(-1) > 0
    lr = old - roll
    mean_old = masked_mean(old, mask, dim=-1)[valid]
    mean_roll = masked_mean(roll, mask, dim=-1)[valid]
    diff = mean_roll - mean_old
    seq_lr = masked_sum(lr, mask, dim=-1)[valid].clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": torch.exp(-mean_old).mean(), "training_log_ppl": (-mean_old).mean(),
        "kl": masked_mean(-lr, mask), "k3_kl": masked_mean(torch.exp(lr) - lr - 1.0, mask),
        "rollout_ppl": torch.exp(-mean_roll).mean(), "rollout_log_ppl": (-mean_roll).mean(),
        "log_ppl_diff": diff.mean(), "log_ppl_abs_diff": diff.abs().mean(),
        "log_ppl_diff_max": diff.max(), "log_ppl_diff_min": diff.min(), "ppl_ratio": torch.exp(diff).mean(),
        "chi2_token": masked_mean(torch.exp(lr.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square(), mask) - 1.0,
        "chi2_seq": torch.exp(2.0 * seq_lr).mean() - 1.0,
    }


def compute_rollout_correction(old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, mask: torch.Tensor,
                               cfg: Any, sum_over_ranks: SumOverRanks = _sum_over_ranks) -> Correction:
    """Weights (``cfg.rollout_is``), rejection (``cfg.rollout_rs``) and the off-policy metrics.

    Args:
        old_log_prob: ``(B, R)`` log-probs of the policy the loss compares against (decoupled:
            the recomputed old policy; bypass: the policy being trained), nats.
        rollout_log_prob: ``(B, R)`` the rollout engine's log-probs of the same tokens.
        mask: ``(B, R)`` response mask.
        cfg: ``algorithm.rollout_correction`` (checked by :func:`rlforge.config.rollout_correction_check.check_config`).
        sum_over_ranks: for ``rollout_is_batch_normalize`` across data-parallel ranks.
    Raises:
        ValueError: the three tensors differ in shape.
    """
    if not (old_log_prob.shape == rollout_log_prob.shape == mask.shape):
        raise ValueError(f"rollout correction: old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
                         f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(mask.shape)} differ")
    log_ratio = old_log_prob.detach().float() - rollout_log_prob.detach().float()
    metrics: Metrics = {}
    weights = None
    if not bool(mask.any()):  # nothing valid on this shard: nothing to weigh or reject
        return Correction(torch.zeros_like(log_ratio) if cfg.rollout_is else None, mask, {})
    if cfg.rollout_is is not None:
        weights, m = is_weights(log_ratio, mask, cfg.rollout_is, float(cfg.rollout_is_threshold),
                                bool(cfg.rollout_is_batch_normalize), sum_over_ranks)
        metrics.update(m)
    new_mask = mask
    if cfg.rollout_rs is not None:
        bounds = parse_rs_thresholds(parse_rs_options(cfg.rollout_rs), cfg.rollout_rs_threshold)
        new_mask, m = rejection_mask(log_ratio, mask, bounds)
        metrics.update(m)
    metrics.update(offpolicy_metrics(old_log_prob, rollout_log_prob, mask))
    return Correction(weights, new_mask, {f"rollout_corr/{k}": v.detach() for k, v in metrics.items()})


def reinforce_loss_matrix(log_prob: torch.Tensor, advantages: torch.Tensor,
                          weights: torch.Tensor | None) -> torch.Tensor:
    """Bypass mode's ``loss_type=reinforce`` per token: ``-A * log pi_theta`` times the detached
    truncated weight ``w`` when given (verl ``compute_policy_loss_reinforce``); ``(B, R)``."""
    loss = -advantages * log_prob
    return loss * weights.detach() if weights is not None else loss

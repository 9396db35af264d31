"""The values of verl's ``algorithm.rollout_correction`` checked without torch (validation runs
before torch is imported: a config error comes back in under a second).  The math that uses them is
:mod:`rlforge.algorithms.rollout_correction`; verl's doc: ``docs/algo/rollout_corr.md``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from rlforge.errors import ConfigError

IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
LOSS_TYPES = ("ppo_clip", "reinforce")
KEY = "algorithm.rollout_correction"


@dataclass(frozen=True)
class Bounds:
    """One rejection criterion's bounds, on the statistic's own scale: ``lower`` is None for
    ``k2``/``k3`` (upper bound only); ``k1`` bounds are logs of the ratio bounds."""

    lower: float | None
    upper: float


def is_enabled(cfg: Any) -> bool:
    """Whether ``algorithm.rollout_correction`` changes training (weights, rejection or bypass)."""
    return cfg.rollout_is is not None or cfg.rollout_rs is not None or bool(cfg.bypass_mode)


def parse_rs_options(spec: Any) -> list[str]:
    """The criteria of ``rollout_rs`` (comma-separated, duplicates removed, order kept).

    Raises:
        ConfigError: an empty or unknown criterion, naming the key and the valid ones."""
    key = f"{KEY}.rollout_rs"
    if not isinstance(spec, str):
        raise ConfigError(f"{key}={spec!r}: expected a comma-separated string of {', '.join(RS_OPTIONS)}")
    options = list(dict.fromkeys(part.strip() for part in spec.split(",") if part.strip()))
    bad = [o for o in options if o not in RS_OPTIONS]
    if not options or bad:
        raise ConfigError(f"{key}={spec!r}: unknown criterion {bad[0] if bad else '(none)'!r}; "
                          f"use one or more (comma-separated) of {', '.join(RS_OPTIONS)}")
    return options


def _positive(text: str, option: str) -> float:
    key = f"{KEY}.rollout_rs_threshold"
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{key}: {text!r} for {option} is not a number") from None
    if not (value > 0 and math.isfinite(value)):
        raise ConfigError(f"{key}: {text!r} for {option} must be a finite number > 0")
    return value


def parse_rs_thresholds(options: list[str], spec: Any) -> dict[str, Bounds]:
    """``rollout_rs_threshold`` per criterion: one entry for all, or one per criterion.

    ``k1`` entries are ``lower_upper`` ratio bounds (one number ``u`` = ``1/u`` to ``u``), stored
    as their logs; ``k2``/``k3`` entries are one upper bound.  Raises ConfigError naming the key."""
    key = f"{KEY}.rollout_rs_threshold"
    if spec is None:
        raise ConfigError(f"{key} is null but {KEY}.rollout_rs={','.join(options)} needs it; set e.g. "
                          f"{key}=0.5_2.0 (k1: ratio bounds) or {key}=0.01 (k2/k3: upper bound)")
    if isinstance(spec, bool) or not isinstance(spec, str | int | float):
        raise ConfigError(f"{key}={spec!r}: expected a number or a string such as '0.5_2.0'")
    parts = [p.strip() for p in str(spec).split(",") if p.strip()]
    if len(parts) not in (1, len(options)):
        raise ConfigError(f"{key}={spec!r}: give one threshold for all {len(options)} criteria of "
                          f"{KEY}.rollout_rs or one per criterion, comma-separated")
    parts = parts * len(options) if len(parts) == 1 else parts
    out: dict[str, Bounds] = {}
    for option, part in zip(options, parts, strict=True):
        if option.endswith("k1"):
            lo_text, _, up_text = part.rpartition("_") if "_" in part else ("", "", part)
            upper = _positive(up_text, option)
            lower = _positive(lo_text, option) if lo_text else 1.0 / upper
            if lower > upper:
                raise ConfigError(f"{key}: {part!r} for {option}: the lower bound exceeds the upper one")
            out[option] = Bounds(math.log(lower), math.log(upper))
        else:
            if "_" in part:
                raise ConfigError(f"{key}: {part!r} for {option}: k2/k3 criteria take one upper bound, "
                                  "not lower_upper")
            out[option] = Bounds(None, _positive(part, option))
    return out


def check_config(cfg: Any) -> None:
    """Every value of ``algorithm.rollout_correction`` checked (ConfigError naming the key)."""
    if cfg.rollout_is is not None and cfg.rollout_is not in IS_LEVELS:
        raise ConfigError(f"{KEY}.rollout_is={cfg.rollout_is!r}: use token, sequence or null")
    threshold = cfg.rollout_is_threshold
    if threshold is None and cfg.rollout_is is None:
        pass  # both off, as verl's scripts write it
    elif not (isinstance(threshold, int | float) and math.isfinite(threshold) and threshold > 0):
        raise ConfigError(f"{KEY}.rollout_is_threshold={threshold!r}: must be a finite number > 0 (verl: 2.0)")
    if cfg.loss_type not in LOSS_TYPES:
        raise ConfigError(f"{KEY}.loss_type={cfg.loss_type!r}: use ppo_clip or reinforce")
    if cfg.rollout_rs is not None:
        parse_rs_thresholds(parse_rs_options(cfg.rollout_rs), cfg.rollout_rs_threshold)

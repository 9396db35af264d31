"""KL estimators, KL-in-reward penalty, KL loss and KL coefficient controllers.

Estimators (per token, of KL(pi || pi_ref) from samples of pi; Schulman 2020,
"Approximating KL Divergence", http://joschu.net/blog/kl-approx.html), with
``d = log_prob - ref_log_prob``:

* ``kl`` / ``k1``: ``d`` (unbiased, high variance, can be negative).
* ``abs``: ``|d|``.
* ``mse`` / ``k2``: ``0.5 * d^2``.
* ``low_var_kl`` / ``k3``: ``r - log r - 1`` with ``r = exp(-d)`` = pi_ref / pi
  (unbiased, non-negative).
* ``<name>+`` (e.g. ``k3+``): the value of ``<name>`` with the gradient of ``k2``
  (straight-through ``k2 + (est - k2).detach()``): k2's gradient is the unbiased gradient of
  the KL, whatever estimator is reported.

Deviation from the blog post, as verl: for ``low_var_kl`` the log-ratio is clamped to
[-20, 20] and the result to [-10, 10] for numerical safety.

Controllers: fixed coefficient, or adaptive (Ziegler et al. 2019, "Fine-Tuning Language Models
from Human Preferences", arXiv:1909.08593, eq. 2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from rlforge.errors import ConfigError
from rlforge.registry import Registry

from .aggregation import agg_loss
from .utils import apply_mask, masked_mean, select_valid

KLFn = Callable[..., torch.Tensor]

KL_ESTIMATORS: Registry[KLFn] = Registry(
    "KL estimator", "algorithm.kl_penalty or actor_rollout_ref.actor.kl_loss_type"
)


@KL_ESTIMATORS.register("kl", "k1")
def kl_k1(*, log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k1 = log_prob - ref_log_prob, (B, R) nats."""
    return log_prob - ref_log_prob


@KL_ESTIMATORS.register("abs")
def kl_abs(*, log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """|log_prob - ref_log_prob|, (B, R)."""
    return (log_prob - ref_log_prob).abs()


@KL_ESTIMATORS.register("mse", "k2")
def kl_k2(*, log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k2 = 0.5 * (log_prob - ref_log_prob)^2, (B, R)."""
    return 0.5 * (log_prob - ref_log_prob).square()


@KL_ESTIMATORS.register("low_var_kl", "k3")
def kl_k3(*, log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k3 = r - log r - 1 with log r = ref_log_prob - log_prob (clamped as verl), (B, R)."""
    log_r = (ref_log_prob - log_prob).clamp(-20.0, 20.0)
    return (torch.exp(log_r) - log_r - 1.0).clamp(-10.0, 10.0)


def _straight_through(value_fn: KLFn) -> KLFn:
    def fn(*, log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
        k2 = kl_k2(log_prob=log_prob, ref_log_prob=ref_log_prob)
        value = value_fn(log_prob=log_prob, ref_log_prob=ref_log_prob)
        return k2 + (value - k2).detach()

    fn.__doc__ = f"Value of {value_fn.__name__}, gradient of k2 (straight-through), (B, R)."
    return fn


for _names, _fn in ((("kl+", "k1+"), kl_k1), (("abs+",), kl_abs), (("mse+", "k2+"), kl_k2),
                    (("low_var_kl+", "k3+"), kl_k3)):
    KL_ESTIMATORS.register(*_names)(_straight_through(_fn))


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate (B, R) of the estimator named ``kl_penalty`` (unmasked).

    Raises:
        ConfigError: for an unknown estimator name.
    """
    return KL_ESTIMATORS.get(kl_penalty)(log_prob=log_prob, ref_log_prob=ref_log_prob)


def kl_loss(
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_loss_type: str,
    loss_agg_mode: str,
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    horizon: float | None = None,
    dp_size: int = 1,
) -> torch.Tensor:
    """Actor KL loss (``actor.use_kl_loss``): ``agg_loss(kl_penalty(...), mask, mode)``, scalar.

    The actor multiplies it by ``actor.kl_loss_coef``.  Globals: see ``agg_loss``.  Masked
    positions count 0 in the value and the gradient, whatever the log-probs hold there.
    """
    kld = kl_penalty(select_valid(log_prob, response_mask), select_valid(ref_log_prob, response_mask), kl_loss_type)
    return agg_loss(
        kld,
        response_mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        horizon=horizon,
        dp_size=dp_size,
    )


class FixedKLController:
    """Constant KL coefficient ``value = kl_coef``; ``update`` does nothing."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept so the trainer never branches on the controller type)."""

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593, eq. 2).

    ``e = clip(current_kl / target_kl - 1, -0.2, 0.2)``; ``beta <- beta * (1 + e * n_steps / horizon)``.
    ``n_steps`` is the number of samples (sequences) in the batch; ``horizon`` is in samples.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if target_kl <= 0:
            raise ConfigError(f"algorithm.kl_ctrl.target_kl must be > 0 for the adaptive controller, got {target_kl}")
        if horizon <= 0:
            raise ConfigError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` towards keeping ``current_kl`` (nats/token) at ``target_kl``."""
        error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, float]:
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.value = float(state["value"])


KLController = FixedKLController | AdaptiveKLController

KL_CONTROLLERS: Registry[Callable[[Any], KLController]] = Registry(
    "KL controller", "algorithm.kl_ctrl.type"
)
KL_CONTROLLERS.register("fixed")(lambda cfg: FixedKLController(cfg.kl_coef))
KL_CONTROLLERS.register("adaptive")(
    lambda cfg: AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.horizon)
)


def build_kl_controller(kl_ctrl_cfg: Any) -> KLController:
    """Build the controller of ``algorithm.kl_ctrl`` (fields type, kl_coef, horizon, target_kl).

    Raises:
        ConfigError: for an unknown ``type`` (names ``algorithm.kl_ctrl.type``).
    """
    return KL_CONTROLLERS.get(kl_ctrl_cfg.type)(kl_ctrl_cfg)


@torch.no_grad()
def apply_kl_penalty(
    token_level_scores: torch.Tensor,
    old_log_probs: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_ctrl: KLController,
    kl_penalty: str = "kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL in the reward (``algorithm.use_kl_in_reward``), as verl's ``apply_kl_penalty``.

    ``rewards = scores - beta * kl * mask`` with ``beta = kl_ctrl.value`` before the update;
    ``current_kl`` = mean over sequences of each sequence's masked-mean KL (nats/token); the
    controller is then updated with ``n_steps = batch size``.

    Args:
        token_level_scores: (B, R) rewards from the reward function.
        old_log_probs, ref_log_prob: (B, R) log-probs of the rollout policy and the reference.
        response_mask: (B, R).
        kl_ctrl: a controller from :func:`build_kl_controller` (mutated: ``update`` is called).
        kl_penalty: estimator name (``algorithm.kl_penalty``).

    Returns:
        token_level_rewards (B, R), metrics ``actor/reward_kl_penalty`` and
        ``actor/reward_kl_penalty_coeff``.
    """
    mask = response_mask.to(token_level_scores.dtype)
    kld = apply_mask(KL_ESTIMATORS.get(kl_penalty)(log_prob=old_log_probs, ref_log_prob=ref_log_prob), mask)
    beta = kl_ctrl.value
    token_level_rewards = token_level_scores - beta * kld
    current_kl = float(masked_mean(kld, mask, dim=-1).mean())
    kl_ctrl.update(current_kl=current_kl, n_steps=token_level_scores.shape[0])
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return token_level_rewards, metrics


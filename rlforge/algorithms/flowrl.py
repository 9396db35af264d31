"""FlowRL loss (``actor_rollout_ref.actor.policy_loss.loss_mode=flowrl``).

Zhu et al. 2025, "FlowRL: Matching Reward Distributions for LLM Reasoning", arXiv:2509.15207,
eq. 6-7: instead of maximizing reward, match the policy to the reward-weighted distribution
``pi_ref(y|x) exp(beta r(x, y)) / Z(x)`` with a trajectory-balance objective.  Per sequence i
(B sequences, R response tokens, means over the valid tokens of i):

    delta_i = log Z(x_i) + mean_t log pi_theta(y_t) - beta * r_hat_i - mean_t log pi_ref(y_t)
    w_i     = clamp(exp(sum_t (log pi_theta - log pi_old)), weight_clamp_min, weight_clamp_max)
    L       = mean_i sg(w_i) * delta_i ** 2

The length-normalized log-probabilities and the importance weight (for the off-policy
mini-batch steps after the first) are the paper's eq. 7.  ``log Z(x)`` comes from a small
learned head (built by the actor; ``log_z_hidden_size``, ``log_z_lr_multiplier``).

This module is only the loss.  Deviations / choices:
* ``r_hat`` is by default the group-normalized reward, exactly GRPO's advantage
  ``(s - mean_g) / (std_g + 1e-6)`` with ``s = sum_t token_level_rewards`` (unbiased std, a
  group of one uses mean 0 and std 1); ``reward=raw`` uses ``s`` itself.  The groups are those
  present in the batch given, so for exact micro-batch invariance with ``group_norm`` every
  micro-batch must hold whole groups (micro batch size a multiple of ``rollout.n``).
* ``use_ref=false`` takes pi_ref uniform: the reference term is a constant and is omitted.
* The summed log-ratio is clamped to [-20, 20] before ``exp`` so an unbounded weight cannot
  overflow when ``weight_clamp_max`` is None.
"""

from __future__ import annotations

from typing import Any

import torch

from rlforge.config.registry_names import flowrl_uses_ref
from rlforge.errors import ConfigError

from .advantages import GRPO_EPS
from .groups import group_ids, grpo_normalized_scores
from .loss_hooks import ExtraModules, PolicyLossHooks, with_hooks
from .policy_losses import LOG_RATIO_CLAMP, POLICY_LOSSES, PolicyLossInputs, PolicyLossOutput
from .utils import masked_sum

FLOWRL_REWARDS = ("group_norm", "raw")
"""Allowed values of ``policy_loss.flowrl.reward``."""

_KEY = "actor_rollout_ref.actor.policy_loss.flowrl"


def _check_inputs(inputs: PolicyLossInputs, cfg: Any) -> None:
    if cfg.reward not in FLOWRL_REWARDS:
        raise ConfigError(f"{_KEY}.reward={cfg.reward!r} is not one of {', '.join(FLOWRL_REWARDS)}")
    missing = []
    if inputs.log_z is None:
        missing.append("log_z (B,) from the actor's log-Z head (built when policy_loss.loss_mode=flowrl)")
    if inputs.token_level_rewards is None:
        missing.append("token_level_rewards (B, R) (the batch's rewards)")
    if cfg.reward == "group_norm" and inputs.index is None:
        missing.append(f"index (B,) prompt uids, needed by {_KEY}.reward=group_norm (or set it to raw)")
    if cfg.use_ref and inputs.ref_log_prob is None:
        missing.append(f"ref_log_prob (B, R) from the reference policy, needed by {_KEY}.use_ref=true "
                       "(or set it to false)")
    if missing:
        raise ConfigError("policy_loss.loss_mode=flowrl is missing inputs: " + "; ".join(missing))


REWARD_TARGET_KEY = "flowrl_reward_target"
"""``PolicyLossInputs.extra`` key of ``r_hat`` (B,) computed over the whole batch before it is split
into micro-batches (the actor does this), so that ``group_norm`` sees every row of a group whatever
the micro-batch split."""


def flowrl_reward_target(token_level_rewards: torch.Tensor, index: Any, reward: str) -> torch.Tensor:
    """``r_hat`` (B,): the sequence score ``s = sum_t rewards`` (``raw``) or GRPO's group-normalized
    ``(s - mean_g) / (std_g + 1e-6)`` (``group_norm``, groups by ``index``).  No grad."""
    scores = token_level_rewards.detach().sum(dim=-1)
    if reward == "raw":
        return scores
    return grpo_normalized_scores(scores, group_ids(index, scores.device), GRPO_EPS, norm_by_std=True)


@POLICY_LOSSES.register("flowrl")
def compute_policy_loss_flowrl(inputs: PolicyLossInputs, config: Any) -> PolicyLossOutput:
    """FlowRL trajectory-balance loss (Zhu et al. 2025, arXiv:2509.15207, eq. 6-7); see the module doc.

    Args:
        inputs: ``log_prob`` (B, R) with grad, ``old_log_prob`` (B, R), ``response_mask`` (B, R),
            ``log_z`` (B,) with grad, ``token_level_rewards`` (B, R), ``index`` (B,) for
            ``reward=group_norm``, ``ref_log_prob`` (B, R) for ``use_ref=true``.  ``advantages``
            is not read.  ``extra[REWARD_TARGET_KEY]`` (B,), when given, is ``r_hat`` as computed over
            the whole batch (group statistics of full groups); otherwise it is computed on this batch.
            ``global_num_seqs`` makes the result this micro-batch's share.
        config: the actor config; reads ``policy_loss.flowrl`` (:class:`FlowRLConfig`).

    Returns:
        loss = sum over sequences with a valid token of ``w_i * delta_i ** 2``, divided by
        ``global_num_seqs`` (or this batch's count).  Metrics (over those sequences):
        ``flowrl/log_z_mean``, ``flowrl/delta_sq_mean``, ``flowrl/weight_mean`` (clamped weight
        used in the loss), ``flowrl/weight_max`` (raw weight before clamping),
        ``flowrl/weight_clipfrac`` (fraction of sequences whose weight was clamped).

    Raises:
        ConfigError (a ValueError): a required input is missing (the message names it and the
            config that needs it), or ``reward`` is not ``group_norm`` / ``raw``.
    """
    cfg = config.policy_loss.flowrl
    _check_inputs(inputs, cfg)
    mask = inputs.response_mask
    batch = mask.shape[0]
    log_z = inputs.log_z.reshape(-1)
    if log_z.shape[0] != batch:
        raise ValueError(f"log_z has {log_z.shape[0]} entries for a batch of {batch}; expected (B,)")
    lengths = mask.sum(dim=-1).clamp_min(1.0)
    mean_log_prob = masked_sum(inputs.log_prob, mask, dim=-1) / lengths
    r_hat = inputs.extra.get(REWARD_TARGET_KEY)  # the whole batch's, where the caller computed it
    if r_hat is None:
        r_hat = flowrl_reward_target(inputs.token_level_rewards, inputs.index, cfg.reward)
    r_hat = r_hat.to(mean_log_prob.dtype)
    delta = log_z + mean_log_prob - float(cfg.beta) * r_hat
    if cfg.use_ref:
        delta = delta - masked_sum(inputs.ref_log_prob.detach(), mask, dim=-1) / lengths

    with torch.no_grad():
        log_w = masked_sum(inputs.log_prob - inputs.old_log_prob, mask, dim=-1)
        w_raw = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        lo, hi = cfg.weight_clamp_min, cfg.weight_clamp_max
        w = w_raw if lo is None and hi is None else w_raw.clamp(min=lo, max=hi)
    loss = inputs.seq_mean(w * delta.square())

    with torch.no_grad():
        valid = mask.sum(dim=-1) > 0
        n = max(int(valid.sum()), 1)
        metrics = {
            "flowrl/log_z_mean": float(log_z[valid].sum()) / n,
            "flowrl/delta_sq_mean": float(delta.square()[valid].sum()) / n,
            "flowrl/weight_mean": float(w[valid].sum()) / n,
            "flowrl/weight_max": float(w_raw[valid].max()) if bool(valid.any()) else 0.0,
            "flowrl/weight_clipfrac": float((w != w_raw)[valid].float().sum()) / n,
        }
    return PolicyLossOutput(loss=loss, metrics=metrics)


def _log_z_modules(actor_cfg: Any, lm: torch.nn.Module) -> ExtraModules:
    """The policy with its log Z head (``log_z_hidden_size``), the head's parameters in their own
    learning-rate group (``log_z_lr_multiplier``)."""
    from rlforge.models.log_z import PolicyWithLogZ

    flow = actor_cfg.policy_loss.flowrl
    return ExtraModules(PolicyWithLogZ(lm, int(flow.log_z_hidden_size)),
                        [(lambda name: name.startswith("log_z_head."), float(flow.log_z_lr_multiplier))], "lm.")


def _log_z_forward(module: torch.nn.Module, mb: Any, temperature: float, with_entropy: bool,
                   chunk_size: int) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
    """The training forward: log-probs, entropy and ``log_z`` (B,) from the head."""
    from rlforge.roles.forward import response_log_probs_with_log_z

    logp, ent, log_z = response_log_probs_with_log_z(module, mb, temperature, with_entropy, chunk_size)
    return logp, ent, {"log_z": log_z}


def _reward_target_inputs(actor_cfg: Any, token_level_rewards: torch.Tensor | None,
                          uids: Any) -> dict[str, torch.Tensor]:
    """``r_hat`` over the whole batch (``group_norm`` on a micro-batch would see part of a group)."""
    flow = actor_cfg.policy_loss.flowrl
    if token_level_rewards is None or not (flow.reward == "raw" or flow.reward == "group_norm" and uids is not None):
        return {}
    return {REWARD_TARGET_KEY: flowrl_reward_target(token_level_rewards, uids, flow.reward).float()}


# What the job builds for this loss: the log Z head and its forward, the reward target over the
# whole batch, and the reference forward unless policy_loss.flowrl.use_ref is false.
with_hooks(PolicyLossHooks(
    needs_ref_log_prob=flowrl_uses_ref,  # torch-free, for validation: registry_names.LOSSES_NEEDING_REF
    extra_modules=_log_z_modules,
    forward=_log_z_forward,
    batch_inputs=_reward_target_inputs,
    # getattr: a saved config of an older run may lack the key (rlforge export reads those)
    exports_extra_modules=lambda actor_cfg: bool(getattr(getattr(actor_cfg.policy_loss, "flowrl", None),
                                                         "export_log_z", False)),
    frozen_keys=(f"{_KEY}.log_z_hidden_size",),
))(compute_policy_loss_flowrl)

"""Critic loss: PPO clipped value loss, as verl's ``compute_value_loss``.

``vpred_clipped = clip(vpreds, values - cliprange_value, values + cliprange_value)``;
per token ``L = 0.5 * max((vpreds - returns)^2, (vpred_clipped - returns)^2)``, aggregated
with ``critic.loss_agg_mode``.  The value clipping is the "PPO2" trick of the OpenAI baselines
(Schulman et al. 2017 implementation; studied in Engstrom et al. 2020, "Implementation Matters
in Deep Policy Gradients", arXiv:2005.12729, §3); it is not in the PPO paper itself.
"""

from __future__ import annotations

import torch

from .aggregation import agg_loss
from .utils import masked_mean


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    *,
    global_num_tokens: float | None = None,
    global_num_seqs: float | None = None,
    horizon: float | None = None,
    dp_size: int = 1,
) -> tuple[torch.Tensor, float]:
    """Clipped value loss.

    Args:
        vpreds: (B, R) values predicted by the critic being trained (with grad).
        returns: (B, R) GAE returns (targets).
        values: (B, R) values of the critic that produced the batch (no grad).
        response_mask: (B, R).
        cliprange_value: ``critic.cliprange_value``, the largest move of a value per update.
        loss_agg_mode: ``critic.loss_agg_mode``; globals as in ``agg_loss``.

    Returns:
        (vf_loss scalar tensor, vf_clipfrac = fraction of valid tokens where the clipped
        term is strictly larger).
    """
    vpred_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    per_token = torch.maximum(loss_unclipped, loss_clipped)
    vf_loss = 0.5 * agg_loss(
        per_token,
        response_mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        horizon=horizon,
        dp_size=dp_size,
    )
    with torch.no_grad():
        vf_clipfrac = float(masked_mean((loss_clipped > loss_unclipped).float(), response_mask))
    return vf_loss, vf_clipfrac

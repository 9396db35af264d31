"""Token entropy of the policy from its logits.

``H = logsumexp(z) - sum_v softmax(z)_v * z_v`` (equal to ``-sum p log p``), computed in
float32 whatever the logits' dtype, as verl's ``entropy_from_logits``.
"""

from __future__ import annotations

import torch


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats, (B, R), of the categorical distributions given by ``logits`` (B, R, V)."""
    z = logits.float()
    probs = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)

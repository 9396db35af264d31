"""Greedy / temperature / top-k / top-p sampling of ``logits: [B, V]`` (float32).

Order as in transformers' ``generate``: temperature, then top-k, then top-p (keeps the
smallest set of tokens whose probability reaches ``top_p``, always at least one).
"""

from __future__ import annotations

import torch

from rlforge.errors import RLForgeError
from rlforge.rollout.base import SamplingParams


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None) -> torch.Tensor:
    """``logits: [B, V]`` -> token ids ``[B]``; ``generator`` None uses torch's global RNG."""
    if params.greedy:
        return logits.argmax(dim=-1)
    x = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k, dim=-1).values[..., -1:]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, dim=-1, descending=False)
        cum = sorted_x.softmax(-1).cumsum(-1)
        remove = cum <= 1 - params.top_p
        remove[..., -1] = False
        x = x.masked_fill(remove.scatter(-1, order, remove), float("-inf"))
    probs = x.softmax(-1)
    if not torch.isfinite(probs).all():
        raise RLForgeError(
            "the policy produced non-finite probabilities: its weights diverged. Lower "
            "actor_rollout_ref.actor.optim.lr or grad_clip, or check the reward scale"
        )
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

"""Token entropy of the policy from its logits.

``H = logsumexp(z) - sum_v softmax(z)_v * z_v`` (equal to ``-sum p log p``), computed in
float32 whatever the logits' dtype, as verl's ``entropy_from_logits``.  Vocabulary-parallel
logits (a ``DTensor`` sharded on the vocabulary, ``strategy=megatron``) take the path of
:mod:`rlforge.algorithms.vocab_parallel`, which never gathers the vocabulary.
"""

from __future__ import annotations

import torch

from .vocab_parallel import is_vocab_parallel, vocab_parallel_entropy


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats, (B, R), of the categorical distributions given by ``logits`` (B, R, V)."""
    if is_vocab_parallel(logits):
        return vocab_parallel_entropy(logits)
    z = logits.float()
    probs = torch.softmax(z, dim=-1)
    return torch.logsumexp(z, dim=-1) - (probs * z).sum(dim=-1)

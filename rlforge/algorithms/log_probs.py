"""Token log-probs of the policy from its logits.

``log p(y) = z_y - logsumexp(z)`` in float32 nats whatever the logits' dtype.  Vocabulary-parallel
logits (a ``DTensor`` sharded on the vocabulary, ``strategy=megatron``) take the path of
:mod:`rlforge.algorithms.vocab_parallel`, which never gathers the vocabulary.  The padded forward
(:mod:`rlforge.roles.forward`) and the packed one (:mod:`rlforge.engine.packing`) both use it.
"""

from __future__ import annotations

import torch

from .vocab_parallel import is_vocab_parallel, vocab_parallel_log_probs


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[label]`` in float32 nats.

    Args:
        logits: ``(batch, len, vocab)``.
        labels: ``(batch, len)`` token ids.
    Returns:
        ``(batch, len)`` float32.  Vocabulary-parallel logits (``strategy=megatron``) are
        handled without gathering the vocabulary (:mod:`rlforge.algorithms.vocab_parallel`).
    """
    if is_vocab_parallel(logits):
        return vocab_parallel_log_probs(logits, labels)
    logits = logits.float()
    return torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def sum_pi_squared_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """``sum_v softmax(logits)_v^2`` per position, computed as ``exp(logsumexp(2 z) - 2 logsumexp(z))``.

    The collision probability of the token distribution, in (0, 1]; the optimal token baseline's
    per-token variance proxy ``1 - 2 pi_t + sum_v pi_v^2`` reads it (verl ``docs/algo/otb.md``).

    Args:
        logits: ``(batch, len, vocab)``; a vocabulary-parallel ``DTensor`` is gathered first.
    Returns:
        ``(batch, len)`` float32.
    """
    if is_vocab_parallel(logits):
        logits = logits.full_tensor()  # type: ignore[attr-defined]
    z = logits.float()
    return torch.exp(torch.logsumexp(2.0 * z, dim=-1) - 2.0 * torch.logsumexp(z, dim=-1))

"""DAPO overlong reward shaping (Yu et al. 2025, "DAPO", §3.4, Eq. 13).

With ``L_max = data.max_response_length`` and ``L_cache = reward_model.overlong_buffer.len``,
a response of ``L`` tokens gets the extra reward

    0                                        if L <= L_max - L_cache
    -(L - (L_max - L_cache)) / L_cache · f   otherwise (down to -f at L = L_max)

where ``f = overlong_buffer.penalty_factor`` (the paper's penalty is 1).  verl's DAPO
reward manager computes the same.
"""

from __future__ import annotations

import torch


def overlong_penalty(
    response_lengths: torch.Tensor, max_response_length: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """``(B,)`` float32 penalties (<= 0) for ``response_lengths`` ``(B,)`` in tokens.

    Raises:
        ValueError: if ``buffer_len`` is not in ``1..max_response_length``.
    """
    if not 0 < buffer_len <= max_response_length:
        raise ValueError(
            f"reward_model.overlong_buffer.len={buffer_len} must be in 1..data.max_response_length "
            f"({max_response_length})"
        )
    expected = max_response_length - buffer_len
    exceed = response_lengths.float() - expected
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)

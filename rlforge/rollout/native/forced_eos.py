"""Test hook: impose response lengths on a model that never samples EOS (benchmarks only).

A random-weight model samples an EOS about once per ``vocab`` tokens, so every response of a
benchmark runs to the length limit.  With the environment variable

    RLFORGE_TEST_RESPONSE_LENGTHS=<file.py>:<function>

the native engine loads ``function(prompt_ids: list[int], sample_index: int) -> int`` once per
``generate`` call and gives each row a length ``L`` (tokens, EOS included): the row stops sampling
after ``L`` tokens and its ``L``-th token is replaced by the first EOS id, as if the model had
sampled it there (the recorded rollout log-prob of that one token stays the sampled token's).
``sample_index`` is the row's ``non_tensor['sample_index']`` where the batch has one (the
trainer's partial rollout sets it), else the row's rank among the rows with the same prompt
(0 .. n-1 for a GRPO batch).  ``benchmarks/e2e_grpo.py --lengths lognormal`` sets it to
``benchmarks/longtail.py:response_length``.  Unset (the default), nothing changes.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

from rlforge.errors import ConfigError

ENV = "RLFORGE_TEST_RESPONSE_LENGTHS"

LengthFn = Callable[[list[int], int], int]


def length_hook() -> LengthFn | None:
    """The function :data:`ENV` names, or None when it is unset.  Raises ConfigError naming the
    variable for a value that is not ``<existing file.py>:<function>``."""
    spec = os.environ.get(ENV, "")
    if not spec:
        return None
    path, _, name = spec.rpartition(":")
    if not path or not name or not Path(path).is_file():
        raise ConfigError(f"{ENV}={spec!r}: expected <file.py>:<function> with an existing file")
    mod_spec = importlib.util.spec_from_file_location(f"_rlforge_length_hook_{Path(path).stem}", path)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    sys.modules[mod_spec.name] = module  # before running it: a dataclass in the file looks its module up there
    mod_spec.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigError(f"{ENV}={spec!r}: {path} has no function {name!r}")
    return fn


def sample_indices(prompts: list[list[int]], given: list[int] | None) -> list[int]:
    """Each row's sample index: ``given`` where set, else its rank among the rows with the same prompt."""
    if given is not None:
        return [int(i) for i in given]
    seen: dict[tuple[int, ...], int] = {}
    out = []
    for p in prompts:
        key = tuple(p)
        out.append(seen.get(key, 0))
        seen[key] = out[-1] + 1
    return out


def force_eos(output_ids: list[int], length: int | None, eos_id: int, eos_ids: frozenset[int]) -> None:
    """In place: where a response stopped at its imposed ``length`` without an EOS, make its last token EOS."""
    if length is not None and len(output_ids) == length and output_ids[-1] not in eos_ids:
        output_ids[-1] = eos_id

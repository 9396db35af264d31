"""Helpers shared by tests (``tests/`` is on ``sys.path`` through pytest's ``pythonpath``
setting in ``pyproject.toml``; the gloo worker scripts add it themselves)."""

from __future__ import annotations

import subprocess

import torch

from rlforge.batch import Batch
from rlforge.rollout.base import assemble


def left_padded_batch(pad: int, eos: int, p_lens: list[int], eos_at: list[int | None], resp_len: int,
                      seed: int = 0) -> Batch:
    """Prompts of ``p_lens`` random tokens, left-padded with ``pad``; responses of ``resp_len``
    random tokens with ``eos`` at ``eos_at[i]`` (None: no EOS), assembled as a rollout would."""
    g = torch.Generator().manual_seed(seed)
    n, width = len(p_lens), max(p_lens)
    ids = torch.full((n, width), pad, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    raw = torch.randint(100, 1000, (n, resp_len), generator=g)
    for i, (p, e) in enumerate(zip(p_lens, eos_at, strict=True)):
        ids[i, width - p:] = torch.randint(100, 1000, (p,), generator=g)
        mask[i, width - p:] = 1
        if e is not None:
            raw[i, e] = eos
    prompts = Batch.from_dict({"input_ids": ids, "attention_mask": mask,
                               "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})
    return assemble(prompts, raw, [eos], pad)


def user_error(res: subprocess.CompletedProcess, *fragments: str) -> str:
    """Assert a clean user error of the CLI (status 2, no traceback, one ``rlforge: error:`` line)
    whose message contains ``fragments``; returns that line."""
    assert "Traceback" not in res.stderr, res.stderr
    assert res.returncode == 2, (res.returncode, res.stderr)
    errors = [line for line in res.stderr.splitlines() if line.startswith("rlforge: error: ")]
    assert len(errors) == 1, res.stderr
    for f in fragments:
        assert f in errors[0], (f, errors[0])
    return errors[0]

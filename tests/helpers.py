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


def text_prompts(tok, texts: list[str]) -> Batch:
    """``texts`` tokenized with ``tok`` (no special tokens), left-padded with its pad id, with
    ``attention_mask`` and ``position_ids``: a prompt batch as the trainer hands to a rollout."""
    ids = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, x in enumerate(ids):
        input_ids[i, width - len(x):] = torch.tensor(x)
        mask[i, width - len(x):] = 1
    return Batch.from_dict({"input_ids": input_ids, "attention_mask": mask,
                            "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})


class GradCapture(torch.optim.Optimizer):
    """An 'optimizer' whose step records the gradient (flattened, in parameter order) and
    leaves the parameters alone, so that one model serves every case."""

    def __init__(self, params):
        super().__init__(list(params), {"lr": 0.0})
        self.grads: torch.Tensor | None = None

    @torch.no_grad()
    def step(self, closure=None):
        ps = [p for g in self.param_groups for p in g["params"]]
        self.grads = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in ps]).clone()


# CPU training runs on ``preset:tiny`` through ``rlforge.cli.main`` (tests/trainer):
SMALL = [
    "actor_rollout_ref.model.path=preset:tiny",
    "trainer.device=cpu",
    "data.train_batch_size=4",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "data.max_response_length=8",
    "data.val_batch_size=8",
    "data.builtin.val_size=8",
    "data.builtin.train_size=64",
]
FAST = ["trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.logger=[file]"]

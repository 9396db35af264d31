"""Helpers of the reward tests (tests/rewards): a batch of responses, a reward file, a config."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import torch

from rlforge.batch import Batch


def make_batch(tokenizer, texts: list[str], truths: list[str], sources: list[str], width: int = 12) -> Batch:
    """Responses = the texts' tokens + EOS, right-padded to ``width`` (mask 0 on padding)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    responses = torch.full((len(texts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(texts), width), dtype=torch.long)
    for i, text in enumerate(texts):
        ids = (tokenizer(text, add_special_tokens=False)["input_ids"] + [eos])[:width] if text else []
        responses[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[i, : len(ids)] = 1
    extra = [{"index": i} for i in range(len(texts))]
    return Batch.from_dict(
        {"responses": responses, "response_mask": mask},
        {"data_source": sources, "ground_truth": truths, "extra_info": extra},
    )


def write(tmp_path: Path, body: str) -> str:
    path = tmp_path / "my_reward.py"
    path.write_text(body)
    return str(path)


def rm_config(path: str | None, name: str = "f", manager: str = "naive", **rm: object) -> SimpleNamespace:
    return SimpleNamespace(
        reward_model=SimpleNamespace(reward_manager=manager, overlong_buffer=SimpleNamespace(enable=False),
                                     timeout_s=rm.get("timeout_s"), failure_score=rm.get("failure_score", 0.0),
                                     num_workers=rm.get("num_workers", 0)),
        custom_reward_function=SimpleNamespace(path=path, name=name, reward_kwargs=rm.get("reward_kwargs", {})),
        data=SimpleNamespace(reward_fn_key="data_source", max_response_length=8),
    )

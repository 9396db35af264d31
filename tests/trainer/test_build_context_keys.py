"""``data`` and ``actor_rollout_ref`` keys that the job's context reads: ``actor_rollout_ref.nccl_timeout`` is
the process group's timeout; ``data.validation_shuffle`` shuffles the validation loader."""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist
from helpers import SMALL

import rlforge.config
from rlforge.trainer.builders import context


def test_nccl_timeout_is_the_process_group_timeout(monkeypatch) -> None:
    cfg = rlforge.config.load_config(["trainer.device=cpu", "actor_rollout_ref.nccl_timeout=1234"])
    seen: list = []
    real = dist.init_process_group

    def spy(*a, **kw):
        seen.append(kw.get("timeout"))
        return real(*a, **kw)

    monkeypatch.setattr(dist, "init_process_group", spy)
    had = dist.is_initialized()
    if had:
        dist.destroy_process_group()
    try:
        context.init_device(cfg)  # one process: a one-rank group in this process
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    # under a launcher (torchrun's variables): the group of init_distributed
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **kw: seen.append(kw.get("timeout")))
    for k, v in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    context.init_device(cfg)
    assert seen == [timedelta(seconds=1234)] * 2


def test_validation_shuffle_shuffles_the_validation_loader(tiny_tokenizer) -> None:
    def order(shuffle: bool) -> list:
        cfg = rlforge.config.load_config([*SMALL, "data.train_files=builtin:arithmetic", "data.val_files=builtin:arithmetic",
                                          "data.builtin.train_size=4", "data.builtin.val_size=16", "data.val_batch_size=16",
                                          f"data.validation_shuffle={str(shuffle).lower()}"])
        val = context.build_data(cfg, tiny_tokenizer, seed=1).val
        return [e["index"] for e in val.next_batch().non_tensor["extra_info"]]

    kept, shuffled = order(False), order(True)
    assert kept == sorted(kept) and len(kept) == 16
    assert sorted(shuffled) == kept and shuffled != kept

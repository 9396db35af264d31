"""Resuming with a changed config: allowed keys take effect (the new learning rate really trains)
and are listed in one line; keys that shape the saved state are one error naming them; a state of
another shape names the mismatch and the checkpoint instead of a raw traceback."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from helpers import FAST, SMALL
from transformers import get_constant_schedule_with_warmup

from rlforge.cli import main
from rlforge.errors import CheckpointError
from rlforge.trainer import checkpoint as ckpt
from rlforge.trainer.resume_config import (
    apply_optim_settings,
    check_resume_config,
    config_changes,
    optim_settings,
)

BASE = {"actor_rollout_ref": {"model": {"path": "preset:tiny", "override_config": {}},
                              "actor": {"optim": {"lr": 1e-3}}},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {"total_training_steps": 1, "resume_mode": "auto"}}


def dump(tree) -> str:
    return yaml.safe_dump(tree)


def changed(**edits) -> dict:
    tree = json.loads(json.dumps(BASE))
    for key, value in edits.items():
        node = tree
        *head, last = key.split("__")
        for part in head:
            node = node[part]
        node[last] = value
    return tree


def test_allowed_changes_are_listed_and_resume_keys_ignored():
    new = changed(actor_rollout_ref__actor__optim__lr=5e-3, trainer__total_training_steps=4,
                  trainer__resume_mode="resume_path")
    changes, frozen = config_changes(dump(BASE), dump(new))
    assert frozen == []
    assert [str(c) for c in changes] == ["actor_rollout_ref.actor.optim.lr: 0.001 -> 0.005",
                                         "trainer.total_training_steps: 1 -> 4"]


@pytest.mark.parametrize(("key", "value"), [
    ("actor_rollout_ref__model__path", "preset:qwen2.5-0.5b"),
    ("actor_rollout_ref__model__override_config", {"num_hidden_layers": 1}),
    ("algorithm__adv_estimator", "gae"),
])
def test_frozen_key_change_is_one_error_naming_it(tmp_path, key, value):
    (tmp_path / "config.yaml").write_text(dump(BASE))
    with pytest.raises(CheckpointError) as e:
        check_resume_config(tmp_path, "config.yaml", dump(changed(**{key: value})))
    assert key.replace("__", ".") in str(e.value) and str(tmp_path) in str(e.value)


def _adam(lr: float, warmup: int):
    w = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.AdamW([w], lr=lr, weight_decay=0.01)
    return type("Engine", (), {"optimizer": opt, "scheduler": get_constant_schedule_with_warmup(opt, warmup)})(), w


@pytest.mark.parametrize(("warmup_old", "warmup_new", "factor"), [(0, 0, 1.0), (0, 10, 0.2), (10, 0, 1.0)])
def test_new_lr_and_schedule_apply_after_loading_the_old_optimizer_state(warmup_old, warmup_new, factor):
    old, w = _adam(1e-3, warmup_old)
    for _ in range(2):  # two RL steps at the old lr
        w.grad = torch.ones(3)
        old.optimizer.step()
        old.scheduler.step()
    state = {"optimizer": old.optimizer.state_dict(), "scheduler": old.scheduler.state_dict()}
    new, _ = _adam(4e-3, warmup_new)
    new.optimizer.param_groups[0]["weight_decay"] = 0.1  # as built from a changed weight_decay
    fresh = optim_settings(new)
    new.optimizer.load_state_dict(state["optimizer"])
    new.scheduler.load_state_dict(state["scheduler"])
    assert new.optimizer.param_groups[0]["lr"] != pytest.approx(4e-3 * factor)  # what loading alone leaves
    apply_optim_settings(new, fresh)
    assert new.optimizer.param_groups[0]["lr"] == pytest.approx(4e-3 * factor)  # step 2 of the new schedule
    assert new.optimizer.param_groups[0]["weight_decay"] == 0.1
    assert new.scheduler.get_last_lr() == [pytest.approx(4e-3 * factor)]
    assert torch.equal(new.optimizer.state[new.optimizer.param_groups[0]["params"][0]]["exp_avg"],
                       old.optimizer.state[w]["exp_avg"])  # the moments are the checkpoint's
    new.scheduler.step()  # step 3 continues the new schedule
    assert new.optimizer.param_groups[0]["lr"] == pytest.approx(4e-3 * (min(1.0, 3 / warmup_new) if warmup_new else 1))


def test_state_mismatch_names_layers_and_first_parameter():
    two = {f"model.layers.{i}.mlp.weight": torch.zeros(4, 4) for i in range(2)} | {"model.embed.weight": torch.zeros(9, 4)}
    one = {"model.layers.0.mlp.weight": (4, 4), "model.embed.weight": (9, 4)}
    assert ckpt.state_mismatch(two, one) == ("the checkpoint has 2 decoder layers, the model 1 (first parameter only "
                                             "in the checkpoint: 'model.layers.1.mlp.weight')")
    wide = {"model.layers.0.mlp.weight": (4, 4), "model.layers.1.mlp.weight": (4, 4), "model.embed.weight": (10, 4)}
    assert ckpt.state_mismatch(two, wide) == "parameter 'model.embed.weight' has shape [9, 4] in the checkpoint, [10, 4] in the model"
    assert ckpt.state_mismatch({"lm." + k: v for k, v in two.items()} | {"log_z_head.w": torch.zeros(1)},
                               {k: tuple(v.shape) for k, v in two.items()}) is None


COMMON = [*SMALL, *FAST, "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]"]


def train(folder, *extra: str) -> int:
    return main(["train", *COMMON, f"trainer.default_local_dir={folder}", *extra])


@pytest.mark.e2e
def test_resume_with_new_lr_trains_at_it_and_records_it(tmp_path, capsys):
    assert train(tmp_path, "trainer.total_training_steps=1", "trainer.save_freq=1",
                 "actor_rollout_ref.actor.optim.lr=1e-3") == 0
    capsys.readouterr()
    assert train(tmp_path, "trainer.total_training_steps=2", "trainer.save_freq=1",
                 "actor_rollout_ref.actor.optim.lr=5e-3") == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "changed since that checkpoint" in line]
    assert len(lines) == 1 and "actor_rollout_ref.actor.optim.lr: 0.001 -> 0.005" in lines[0]
    assert "trainer.total_training_steps: 1 -> 2" in lines[0]
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["actor/lr"]) for r in rows] == [(1, 1e-3), (2, 5e-3)]
    saved = yaml.safe_load((tmp_path / "global_step_2" / "config.yaml").read_text())
    assert saved["actor_rollout_ref"]["actor"]["optim"]["lr"] == 5e-3

    # another layer count: one error naming the key, before any weight is loaded
    assert train(tmp_path, "trainer.total_training_steps=3", "+actor_rollout_ref.model.override_config.num_hidden_layers=1") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlforge: error: ")]
    assert len(err) == 1 and "actor_rollout_ref.model.override_config" in err[0] and "global_step_2" in err[0], err

    # a checkpoint without config.yaml (hand-made, or older): the state-dict guard names the mismatch
    for name in ("config.yaml", "manifest.json"):
        (tmp_path / "global_step_2" / name).unlink()
    (tmp_path / "global_step_1" / "manifest.json").unlink()  # an older rlforge wrote none (else: "manifest missing")
    assert train(tmp_path, "trainer.total_training_steps=3", "+actor_rollout_ref.model.override_config.num_hidden_layers=1") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlforge: error: ")]
    assert len(err) == 1 and str(tmp_path / "global_step_2" / "actor") in err[0], err
    assert "the checkpoint has 2 decoder layers, the model 1" in err[0], err


@pytest.mark.e2e
def test_corrupted_checkpoint_stops_the_resume(tmp_path, capsys):
    assert train(tmp_path, "trainer.total_training_steps=2", "trainer.save_freq=1") == 0
    state = tmp_path / "global_step_2" / "actor" / "__0_0.distcp"  # the one rank's shard file (DCP)
    data = bytearray(state.read_bytes())
    data[-8192:-4096] = bytes(b ^ 0xFF for b in data[-8192:-4096])  # 4 KiB inside the tensors' bytes
    state.write_bytes(bytes(data))
    capsys.readouterr()
    assert train(tmp_path, "trainer.total_training_steps=3") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlforge: error: ")]
    assert len(err) == 1 and "actor/__0_0.distcp" in err[0] and "global_step_2" in err[0], err
    assert train(tmp_path, "trainer.total_training_steps=3", "trainer.resume_fallback=true") == 0
    out = capsys.readouterr()
    assert f"resumed from {tmp_path / 'global_step_1'} at step 1" in out.out
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows][-2:] == [2, 3]


@pytest.mark.e2e
def test_a_sharded_checkpoint_of_another_shape_or_with_a_truncated_shard_is_one_error(tmp_path, capsys):
    """A sharded (DCP) checkpoint without the config and manifest that catch these first: a parameter of
    another shape is one error naming both shapes; a truncated shard is one error naming the file."""
    assert train(tmp_path, "trainer.total_training_steps=1", "trainer.save_freq=1") == 0
    folder = tmp_path / "global_step_1"
    for name in ("config.yaml", "manifest.json"):
        (folder / name).unlink()
    capsys.readouterr()
    assert train(tmp_path, "trainer.total_training_steps=2",
                 "+actor_rollout_ref.model.override_config.intermediate_size=100") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlforge: error: ")]
    assert len(err) == 1 and str(folder / "actor") in err[0], err
    assert "has shape [" in err[0] and "in the checkpoint, [100, " in err[0] and "in the model" in err[0], err
    shard = folder / "actor" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-4096])
    assert train(tmp_path, "trainer.total_training_steps=2") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlforge: error: ")]
    assert len(err) == 1 and f"checkpoint file {shard} has " in err[0] and "truncated" in err[0], err

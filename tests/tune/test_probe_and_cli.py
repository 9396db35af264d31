"""Probes that run out of memory are dropped; ``rlforge tune`` and the start-of-run table; the memory check."""

import json

import pytest
import torch

from rlforge.cli import main
from rlforge.config import load_config
from rlforge.tune.device import SPECS
from rlforge.tune.memcheck import compare, markdown, measured_peaks
from rlforge.tune.plan import Inputs, choose
from rlforge.tune.probe import probe_best, probe_plan
from rlforge.tune.shapes import model_shape
from rlforge.tune.tuner import tune_at_start
from rlforge.tune.workload import Workload

WORKLOAD = ["actor_rollout_ref.model.path=preset:qwen2.5-0.5b", "data.train_batch_size=64",
            "actor_rollout_ref.rollout.n=8", "data.max_prompt_length=256", "data.max_response_length=1024",
            "actor_rollout_ref.actor.ppo_mini_batch_size=64", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.actor.strategy=fsdp2"]


def _plan():
    wl = Workload(rows=512, mini_rows=512, prompt_len=256, response_len=1024)
    return choose(Inputs(model_shape("preset:qwen2.5-0.5b"), wl, SPECS["H200"]))


def test_a_probe_that_runs_out_of_memory_is_dropped():
    plan = _plan()
    best3 = sorted(plan.candidates, key=lambda c: c.time.total)[:3]
    seconds = {best3[1].levers: 9.0, best3[2].levers: 7.0}

    def probe(lev):
        if lev == best3[0].levers:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return seconds[lev]

    winner, measured, dropped = probe_best(plan.candidates, probe, k=3)
    assert dropped == [best3[0].levers] and measured == seconds and winner is best3[2]
    probe_plan(plan, probe, k=3)
    assert plan.chosen is best3[2] and plan.measured_s == seconds


def test_other_probe_errors_are_not_swallowed():
    def probe(lev):
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        probe_best(_plan().candidates, probe)


def test_rlforge_tune_prints_the_table_and_the_override_line(capsys):
    assert main(["tune", "--device", "h200", *WORKLOAD, "actor_rollout_ref.model.enable_gradient_checkpointing=true"]) == 0
    out = capsys.readouterr().out
    assert "| lever | verl default | chosen |" in out and "Paste (verl's keys):" in out
    assert "actor_rollout_ref.actor.use_dynamic_bsz=true" in out
    assert "enable_gradient_checkpointing=true: auto would choose false" in out


def test_rlforge_tune_plans_more_gpus_than_here(capsys):
    assert main(["tune", "--device", "h200", "--gpus", "8",
                 *[o.replace("qwen2.5-0.5b", "qwen2.5-7b") for o in WORKLOAD]]) == 0
    out = capsys.readouterr().out
    assert "predicted for 8 x" in out and "TP 4 x PP 2" in out and "FSDP 8 x TP 1 x PP 1" in out


def test_start_of_run_table_writes_free_keys_only_and_cpu_changes_nothing():
    cfg = load_config([*WORKLOAD, "actor_rollout_ref.model.enable_gradient_checkpointing=true"])
    lines: list[str] = []
    assert tune_at_start(cfg, SPECS["cpu"], lines.append) == [] and "cpu" in lines[0]
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is False
    written = tune_at_start(cfg, SPECS["H200"], lines.append)
    assert "actor_rollout_ref.actor.use_dynamic_bsz=true" in written
    assert not any("enable_gradient_checkpointing" in w and "critic" not in w for w in written)
    assert cfg.actor_rollout_ref.model.enable_gradient_checkpointing is True
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is True
    assert lines[1].startswith("rlforge tune: NVIDIA H200 | predicted peak")


def test_memory_check_against_a_metrics_file(tmp_path):
    f = tmp_path / "metrics.jsonl"
    rows = [{"perf/max_memory_allocated_gb/update_actor": 40.0, "perf/max_memory_allocated_gb/gen": 10.0},
            {"perf/max_memory_allocated_gb/update_actor": 50.0, "step": 2}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert measured_peaks(f) == {"update_actor": 50.0, "gen": 10.0}
    plan = _plan()
    table = compare(plan.chosen.memory, measured_peaks(f))
    row = next(r for r in table if r.stage == "update_actor")
    assert row.error == pytest.approx(row.predicted_gb / 50.0 - 1)
    assert "| update_actor |" in markdown(table)


def test_device_rates_are_measured_once_and_cached(tmp_path, monkeypatch):
    from rlforge.tune.bench import measured_device

    monkeypatch.setenv("RLFORGE_CACHE", str(tmp_path))
    calls = []

    def measure():
        calls.append(1)
        return 5e14, 3e12

    first = measured_device(SPECS["H200"], measure)
    again = measured_device(SPECS["H200"], measure)
    assert calls == [1] and first == again and first.flops == 5e14 and first.measured
    assert measured_device(SPECS["cpu"], measure) == SPECS["cpu"]

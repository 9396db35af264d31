"""``rlforge check-config`` (issue 38, item 6): per-key verdicts, exit status, one-line refusals, no torch."""

from __future__ import annotations

import pytest

from rlforge.cli import main
from rlforge.config.check import AUTO, MAPPED, TAKES_EFFECT, WARNED, check_config

_ARR = "actor_rollout_ref"


def test_each_key_gets_its_verdict() -> None:
    report = check_config([f"{_ARR}.rollout.name=vllm", f"{_ARR}.actor.optim.warmup_style=cosine",
                           "data.train_batch_size=256", "+foo.bar=1"])
    got = {v.key: v.verdict for v in report.keys}
    assert got == {f"{_ARR}.rollout.name": WARNED, f"{_ARR}.actor.optim.warmup_style": MAPPED,
                   "data.train_batch_size": TAKES_EFFECT, "foo.bar": WARNED}
    mapped = next(v for v in report.keys if v.verdict == MAPPED)
    assert mapped.line() == f"{_ARR}.actor.optim.warmup_style: mapped -> {_ARR}.actor.optim.lr_scheduler_type"
    # verl's default rollout TP=2 warns, but the user did not set it: not one of the user's keys
    assert any("tensor_model_parallel_size=2" in w for w in report.other_warnings)


def test_a_verl_alias_is_mapped_onto_rlforge_key() -> None:
    """verl_keys.ALIASES (not only the loader's older spellings): ``optim.clip_grad`` is the actor's ``grad_clip``."""
    report = check_config([f"{_ARR}.actor.optim.clip_grad=0.5", f"{_ARR}.model.lora.rank=8"])
    assert [v.line() for v in report.keys] == [f"{_ARR}.actor.optim.clip_grad: mapped -> {_ARR}.actor.grad_clip",
                                               f"{_ARR}.model.lora.rank: mapped -> {_ARR}.model.lora_rank"]


def test_a_nested_free_form_key_is_named_by_its_parents_warning() -> None:
    report = check_config([f"{_ARR}.rollout.engine_kwargs.vllm.enable_expert_parallel=true"])
    (verdict,) = report.keys
    assert verdict.verdict == WARNED and "engine arguments are not used" in verdict.detail


def test_cli_prints_lines_and_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["check-config", "data.train_batch_size=256", f"--{_ARR}.rollout.n", "4"])
    out = capsys.readouterr().out.splitlines()
    assert status == 0
    assert out[:2] == ["data.train_batch_size: takes effect", f"{_ARR}.rollout.n: takes effect"]
    assert out[-1] == "2 keys: 2 takes effect, 0 mapped, 0 warned, 0 auto; none refused"


def test_cli_with_verl_config_name(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["check-config", "--config-path=config", "--config-name=ppo_megatron_trainer.yaml",
                   f"{_ARR}.actor.megatron.tensor_model_parallel_size=1"])
    assert status == 0
    assert f"{_ARR}.actor.megatron.tensor_model_parallel_size: takes effect" in capsys.readouterr().out


@pytest.mark.parametrize("override, line", [
    ("trainer.device=npu", "rlforge: error: trainer.device=npu: Ascend NPUs (torch_npu) are not supported; "
                           "rlforge runs on NVIDIA CUDA GPUs or the CPU (set trainer.device=cuda, cpu or auto)\n"),
    (f"{_ARR}.actor.optim.lrr=1e-6", f"rlforge: error: unknown config key '{_ARR}.actor.optim.lrr'; did you mean "
                                     f"'{_ARR}.actor.optim.lr'?\n"),
])
def test_cli_refusal_is_one_line_and_exit_two(override: str, line: str, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["check-config", override])
    captured = capsys.readouterr()
    assert (status, captured.err, captured.out) == (2, line, "")


@pytest.mark.e2e
def test_check_config_imports_no_torch() -> None:
    """Measured by the imports of a fresh interpreter (tests/cli/test_config_before_torch.py's way)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    code = ("import json, sys\nfrom rlforge.cli import main\n"
            f"status = main(['check-config', '--config-name=ppo_trainer', '{_ARR}.rollout.name=vllm'])\n"
            "print(json.dumps([status, [m for m in ('torch', 'transformers', 'numpy') if m in sys.modules]]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(done.stdout.splitlines()[-1]) == [0, []], done.stderr


def test_verl_rollout_backends_run_as_native_with_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("vllm", "sglang", "trtllm"):
        assert main(["check-config", f"{_ARR}.rollout.name={name}"]) == 0
        out = capsys.readouterr().out
        assert f"{_ARR}.rollout.name: warned" in out and "running rlforge's native engine instead" in out, out


_TUNED = ("auto (tuned: rlforge train chooses it for the GPU at start, `rlforge tune` shows the plan; on a CPU it "
          "keeps its default)")


def test_auto_on_the_command_line_is_reported_as_tuned() -> None:
    report = check_config([f"{_ARR}.actor.use_dynamic_bsz=auto", "critic.use_dynamic_bsz=true"])
    assert [v.line() for v in report.keys] == [f"{_ARR}.actor.use_dynamic_bsz: {_TUNED}",
                                               "critic.use_dynamic_bsz: takes effect"]


def test_auto_in_a_config_file_is_reported_as_on_the_command_line(tmp_path, capsys) -> None:
    f = tmp_path / "run.yaml"
    f.write_text(f"{_ARR}:\n  actor:\n    use_dynamic_bsz: auto\n  rollout:\n    max_num_seqs: auto\n"
                 "data:\n  train_batch_size: 512\n")
    report = check_config(config_file=str(f))
    assert {v.key: v.verdict for v in report.keys} == {f"{_ARR}.actor.use_dynamic_bsz": AUTO,
                                                       f"{_ARR}.rollout.max_num_seqs": AUTO,
                                                       "data.train_batch_size": TAKES_EFFECT}
    # a later value takes the key back from auto
    back = check_config([f"{_ARR}.rollout.max_num_seqs=64"], config_file=str(f))
    assert {v.key: v.verdict for v in back.keys}[f"{_ARR}.rollout.max_num_seqs"] == TAKES_EFFECT
    # --config-path/--config-name: the same, and the CLI counts it
    (tmp_path / "mine.yaml").write_text(f"defaults:\n  - ppo_trainer\n  - _self_\n{_ARR}:\n  rollout:\n"
                                        "    max_num_seqs: auto\n")
    assert main(["check-config", f"--config-path={tmp_path}", "--config-name=mine"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{_ARR}.rollout.max_num_seqs: {_TUNED}"
    assert out[-1] == "1 keys: 0 takes effect, 0 mapped, 0 warned, 1 auto; none refused"

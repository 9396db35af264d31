"""The start line and the summary of ``rlforge train`` (rlforge.trainer.summary), the validation
record they read (rlforge.tracking.Tracking), and progress bars off a terminal (rlforge.progress)."""

from __future__ import annotations

import io

from rlforge.config import load_config
from rlforge.progress import interactive, progress_bar
from rlforge.tracking import Tracking
from rlforge.trainer.summary import end_lines, start_line

VAL = "val-core/rlforge/arithmetic/reward/mean@1"


def test_tracking_keeps_first_and_last_validation(tmp_path):
    tr = Tracking([], tmp_path)
    tr.log({VAL: 0.125}, step=0)
    tr.log({"critic/score/mean": 0.5}, step=1)
    tr.log({"critic/score/mean": 0.5, VAL: 0.25}, step=2)
    tr.log({"critic/score/mean": 0.7}, step=3)
    assert tr.first_validation == (0, {VAL: 0.125}) and tr.last_validation == (2, {VAL: 0.25})


def test_summary_lines(tmp_path):
    cfg = load_config([f"trainer.default_local_dir={tmp_path}", "trainer.save_freq=2",
                       "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]"], job=None)
    (tmp_path / "global_step_2" / "actor" / "huggingface").mkdir(parents=True)
    done, where = end_lines(cfg, ["console", "file"], 125.0, 2, (0, {VAL: 0.125}), (2, {VAL: 0.25}))
    assert done == f"rlforge train: done in 2 min 5 s at step 2 | {VAL} 0.125 (step 0) -> 0.25 (step 2)"
    step = tmp_path / "global_step_2"
    assert where == (f"rlforge train: metrics {tmp_path / 'metrics.jsonl'} | model {step} "
                     f"(Hugging Face folder: {step / 'actor' / 'huggingface'})")
    done, where = end_lines(cfg, ["console"], 3.21, 1, None, None)
    assert done == "rlforge train: done in 3.2 s at step 1 | no validation"
    assert "console only" in where and "model not saved (trainer.save_freq=2)" in where


def test_start_line_names_model_task_steps_device_output(tmp_path):
    cfg = load_config(["actor_rollout_ref.model.path=preset:tiny", "trainer.total_epochs=3",
                       "data.train_files=[a.parquet,b.parquet]", f"trainer.default_local_dir={tmp_path}",
                       "trainer.n_gpus_per_node=2"], job=None)
    assert start_line(cfg, "cpu") == (f"rlforge train: start | model preset:tiny | task a.parquet,b.parquet | "
                                      f"algorithm gae | 3 epochs (trainer.total_epochs) | device cpu x 2 processes "
                                      f"| output {tmp_path}")


def test_progress_bar_is_silent_off_a_terminal(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stdout", io.StringIO())
    monkeypatch.setattr("sys.stderr", err)
    assert not interactive()
    for _ in progress_bar(range(3), desc="x", file=err):
        pass
    bar = progress_bar(total=5, desc="gen", file=err)
    bar.update(5)
    bar.close()
    assert err.getvalue() == ""


def test_summary_names_the_hugging_face_folder_of_an_hf_model_only_save(tmp_path):
    cfg = load_config([f"trainer.default_local_dir={tmp_path}", "trainer.save_freq=3",
                       "actor_rollout_ref.actor.checkpoint.save_contents=[hf_model]"], job=None)
    hf = tmp_path / "global_step_3" / "actor" / "huggingface"
    hf.mkdir(parents=True)
    _, where = end_lines(cfg, ["file"], 1.0, 3, None, None)
    assert where == f"rlforge train: metrics {tmp_path / 'metrics.jsonl'} | model {hf} (Hugging Face folder)"


def test_summary_of_a_checkpoint_without_hf_model_names_the_export_command(tmp_path):
    cfg = load_config([f"trainer.default_local_dir={tmp_path}", "trainer.save_freq=2",
                       "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]"], job=None)
    step = tmp_path / "global_step_2"
    (step / "actor").mkdir(parents=True)
    _, where = end_lines(cfg, ["file"], 1.0, 2, None, None)
    assert where == (f"rlforge train: metrics {tmp_path / 'metrics.jsonl'} | model {step} "
                     f"(a checkpoint; `rlforge export {step} --out DIR` writes a Hugging Face folder)")


def test_summary_of_a_lora_save_names_the_adapter_and_the_merge_command(tmp_path):
    cfg = load_config([f"trainer.default_local_dir={tmp_path}", "trainer.save_freq=2"], job=None)
    step = tmp_path / "global_step_2"
    hf = step / "actor" / "huggingface"
    hf.mkdir(parents=True)
    _, plain = end_lines(cfg, ["file"], 1.0, 2, None, None)
    assert plain.endswith(f"model {step} (Hugging Face folder: {hf})")
    (hf / "adapter_config.json").write_text("{}")
    _, where = end_lines(cfg, ["file"], 1.0, 2, None, None)
    assert where.endswith(f"model {step} (peft adapter folder: {hf}; `rlforge export {step} --out DIR --merge` "
                          "writes the merged model as a Hugging Face folder)")


def _resumed_trainer(tmp_path, rows: list[tuple[int, dict[str, float]]], seen: tuple[int, dict[str, float]]):
    """A finished trainer of a run resumed at ``seen``'s step; ``rows`` were logged (to
    ``metrics.jsonl``) before the resume, ``seen`` and step 5 after it."""
    from types import SimpleNamespace

    from rlforge.tracking import FileLogger

    log = FileLogger(tmp_path)
    for step, metrics in [*rows, seen, (5, {VAL: 0.5})]:
        log.log(metrics, step)
    log.close()
    tracker = SimpleNamespace(first_validation=seen, last_validation=(5, {VAL: 0.5}))
    return SimpleNamespace(rank=0, global_step=5, tracker=tracker)


def test_summary_after_a_resume_compares_with_step_0_of_the_run(tmp_path, capsys):
    from rlforge.trainer.summary import print_summary

    cfg = load_config([f"trainer.default_local_dir={tmp_path}"], job=None)
    rows = [(0, {VAL: 0.125}), (1, {"critic/score/mean": 0.2}), (2, {VAL: 0.25, "critic/score/mean": 0.3})]
    print_summary(cfg, ["file"], 0.0, _resumed_trainer(tmp_path, rows, (3, {VAL: 0.375})))
    done = capsys.readouterr().out.splitlines()[0]
    assert done.endswith(f"| {VAL} 0.125 (step 0) -> 0.5 (step 5)"), done


def test_summary_after_a_resume_of_a_run_without_step_0_validation(tmp_path, capsys):
    from rlforge.trainer.summary import first_validation_in, print_summary

    cfg = load_config([f"trainer.default_local_dir={tmp_path}"], job=None)
    rows = [(1, {VAL: 0.0625, "critic/score/mean": 0.1}), (2, {"critic/score/mean": 0.3})]
    print_summary(cfg, ["file"], 0.0, _resumed_trainer(tmp_path, rows, (3, {VAL: 0.375})))
    assert capsys.readouterr().out.splitlines()[0].endswith(f"| {VAL} 0.0625 (step 1) -> 0.5 (step 5)")
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 0, "val-core/x": 0.5')  # a line cut by a crash is skipped
    assert first_validation_in(tmp_path / "metrics.jsonl") == (1, {VAL: 0.0625})
    assert first_validation_in(tmp_path / "missing.jsonl") is None


def test_summary_of_a_fresh_run_without_a_metrics_file(tmp_path, capsys):
    from rlforge.trainer.summary import run_first_validation

    assert run_first_validation(tmp_path, (0, {VAL: 0.125})) == (0, {VAL: 0.125})
    assert run_first_validation(tmp_path, None) is None

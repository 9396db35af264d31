"""A reward model and a judge in a training step (``rlforge train``, one step on preset:tiny), and every
``reward_model`` key they own is consumed by such a run or warned about (``tests/config/test_no_silent_keys.py``'s
detector, applied to the reward-model keys; that module walks every other key and leaves these to this one).

Not walked here: the reward-manager keys (``reward_manager``, ``launch_reward_fn_async``, ``reward_kwargs``,
``overlong_buffer``, ``sandbox_fusion``, ``profiler``), which belong to the reward managers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from config.test_no_silent_keys import ReadRecorder, not_reported, schema_keys
from helpers import FAST, SMALL
from transformers import LlamaConfig, LlamaForSequenceClassification

import rlforge.config
from rlforge.config.reward import RewardModelConfig
from rlforge.config.root import RLForgeConfig  # noqa: F401  (the schema the keys come from)
from rlforge.rewards.model_reward import build_model_scorer

pytestmark = pytest.mark.e2e

NOT_OURS = ("reward_model.reward_manager", "reward_model.launch_reward_fn_async", "reward_model.reward_kwargs",
            "reward_model.overlong_buffer.", "reward_model.sandbox_fusion", "reward_model.profiler")


def _keys() -> list[str]:
    return [k for k in schema_keys(RewardModelConfig, "reward_model") if not k.startswith(NOT_OURS)]


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory) -> Path:
    import os

    from rlforge.models import load_tokenizer

    tok = load_tokenizer("preset:tiny", os.environ.get("RLFORGE_TEST_TOKENIZER") or None)
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, vocab_size=len(tok), pad_token_id=tok.pad_token_id, num_labels=1)
    out = tmp_path_factory.mktemp("rm") / "rm"
    LlamaForSequenceClassification(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def _train(tmp: Path, *overrides: str) -> tuple[dict, set[str]]:
    """One training step; the last metrics line and the config keys read."""
    from rlforge.cli import run_train

    recorder = ReadRecorder()
    real = rlforge.config.load_config
    args = [*SMALL, *FAST, "trainer.total_training_steps=1", f"trainer.default_local_dir={tmp}", *overrides]
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(rlforge.config, "load_config", lambda *a, **k: recorder.track(real(*a, **k)))
        assert run_train(args, None, "default", False) == 0
    lines = [json.loads(x) for f in sorted(tmp.rglob("metrics.jsonl")) for x in f.read_text().splitlines() if x]
    return lines[-1], recorder.reads


def _flat(line: dict) -> dict:
    return line.get("metrics", line) if isinstance(line.get("metrics"), dict) else line


@pytest.mark.slow  # two one-step runs, ~35 s on 2 cores
def test_reward_model_and_judge_in_a_step_and_their_keys(tmp_path, rm_folder) -> None:
    rm_line, rm_reads = _train(tmp_path / "rm", "reward_model.enable=true", f"reward_model.model.path={rm_folder}",
                               "reward_model.micro_batch_size_per_gpu=3")
    m = _flat(rm_line)
    assert "reward/model_score/mean" in m and "timing_s/reward" in m, sorted(m)
    judge_line, judge_reads = _train(tmp_path / "judge", "reward_model.judge.enable=true",
                                     "reward_model.judge.path=preset:tiny", "reward_model.judge.response_length=3",
                                     "reward_model.combine=sum")
    m = _flat(judge_line)
    assert m["reward/judge_parse_failures"] >= 0 and "reward/judge_parse_failure_rate" in m, sorted(m)
    # the dynamic-batching path of the reward model (built only)
    recorder = ReadRecorder()
    cfg = recorder.track(rlforge.config.load_config(
        ["reward_model.enable=true", f"reward_model.model.path={rm_folder}", "reward_model.use_dynamic_bsz=true"]))
    build_model_scorer(cfg, torch.device("cpu"))
    read = rm_reads | judge_reads | recorder.reads
    keys = _keys()
    unread = [k for k in keys if k not in read]
    on_rm = rlforge.config.load_config(["reward_model.enable=true", f"reward_model.model.path={rm_folder}"])
    silent = not_reported(on_rm, [k for k in unread if not k.startswith("reward_model.judge.")])
    on_judge = rlforge.config.load_config(["reward_model.judge.enable=true", "reward_model.judge.path=preset:tiny"])
    silent += not_reported(on_judge, [k for k in unread if k.startswith("reward_model.judge.")])
    assert not silent, f"reward_model keys neither read by a run nor warned about: {silent}"
    assert {"reward_model.enable", "reward_model.model.path", "reward_model.micro_batch_size_per_gpu",
            "reward_model.use_dynamic_bsz", "reward_model.max_length", "reward_model.judge.prompt_template"} <= read

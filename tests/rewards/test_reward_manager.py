"""RewardManager: decoding, score placement, custom reward functions and their errors."""

from __future__ import annotations

import math
import re

import pytest
import torch
from reward_helpers import make_batch, rm_config, write

from rlforge.errors import ConfigError, RewardError
from rlforge.rewards import RewardManager, build_reward_manager, last_valid_index


def test_last_valid_index() -> None:
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]])
    assert last_valid_index(mask).tolist() == [2, 0, 0, 3]


def test_rules_scores_on_last_valid_token(smol_tokenizer) -> None:
    batch = make_batch(
        smol_tokenizer,
        ["12", "13", "So 48+24=72.\n#### 72", ""],
        ["12", "12", "72", "5"],
        ["rlforge/arithmetic", "rlforge/arithmetic", "openai/gsm8k", "rlforge/arithmetic"],
        width=16,
    )
    out = RewardManager(smol_tokenizer).score(batch)
    assert out.decoded[0] == "12" and out.decoded[3] == ""  # EOS skipped as special
    assert out.scores.dtype == torch.float32 and out.scores.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert out.token_level_scores.shape == (4, 16) and out.token_level_scores.dtype == torch.float32
    last = batch["response_mask"].sum(-1) - 1
    assert out.token_level_scores[0, int(last[0])] == 1.0  # on the EOS, the last valid token
    assert out.token_level_scores[2, int(last[2])] == 1.0
    assert out.token_level_scores.sum().item() == 2.0  # zeros elsewhere, padding included
    assert out.token_level_scores[3].abs().sum() == 0.0  # empty response: score (0) at index 0


def test_empty_response_score_goes_to_index_0(smol_tokenizer, tmp_path) -> None:
    path = write(
        tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info):\n    return 0.5\n"
    )
    batch = make_batch(smol_tokenizer, ["", "7"], ["1", "1"], ["x", "x"], width=4)
    out = RewardManager(smol_tokenizer, custom_path=path).score(batch)
    assert out.token_level_scores.tolist() == [[0.5, 0, 0, 0], [0, 0.5, 0, 0]]


def test_custom_float_sees_all_arguments(smol_tokenizer, tmp_path) -> None:
    path = write(
        tmp_path,
        "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
        "    return float(len(solution_str)) + (10.0 if data_source == 'any/source' else 0.0)"
        " + 100.0 * extra_info['index'] + (1000.0 if ground_truth == 'g' else 0.0)\n",
    )
    batch = make_batch(smol_tokenizer, ["abc", "hello"], ["g", "h"], ["any/source", "other"])
    out = RewardManager(smol_tokenizer, custom_path=path).score(batch)
    assert out.scores.tolist() == [1013.0, 105.0]
    assert out.extra == {}


def test_custom_dict_extra_keys(smol_tokenizer, tmp_path) -> None:
    path = write(
        tmp_path,
        "def my_fn(data_source, solution_str, ground_truth, extra_info):\n"
        "    out = {'score': 1.0 if solution_str == ground_truth else -1.0, 'acc': solution_str == ground_truth,"
        " 'pred': solution_str}\n"
        "    if extra_info['index'] == 0:\n        out['bonus'] = 0.25\n    return out\n",
    )
    batch = make_batch(smol_tokenizer, ["12", "7"], ["12", "8"], ["a", "b"])
    out = RewardManager(smol_tokenizer, custom_path=path, custom_name="my_fn").score(batch)
    assert out.scores.tolist() == [1.0, -1.0]
    assert out.extra["acc"] == [1.0, 0.0]
    assert out.extra["bonus"][0] == 0.25 and math.isnan(out.extra["bonus"][1])
    assert out.extra_text == {"pred": ["12", "7"]}


def test_custom_missing_file(smol_tokenizer, tmp_path) -> None:
    missing = str(tmp_path / "nope.py")
    with pytest.raises(RewardError, match="nope.py.*not found"):
        RewardManager(smol_tokenizer, custom_path=missing)


def test_custom_missing_function(smol_tokenizer, tmp_path) -> None:
    path = write(tmp_path, "def other(**kw):\n    return 1.0\n")
    with pytest.raises(RewardError) as err:
        RewardManager(smol_tokenizer, custom_path=path, custom_name="compute_score")
    assert "compute_score" in str(err.value) and "my_reward.py" in str(err.value)


def test_custom_import_error(smol_tokenizer, tmp_path) -> None:
    path = write(tmp_path, "import not_a_real_module_xyz\n")
    with pytest.raises(RewardError, match="failed to import.*not_a_real_module_xyz"):
        RewardManager(smol_tokenizer, custom_path=path)


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        (
            "    if extra_info['index'] == 1:\n        raise ValueError('boom here')\n    return 1.0\n",
            r"sample 1 \(data_source='src1'\) raised ValueError: boom here",
        ),
        (
            "    return 'one' if extra_info['index'] == 1 else 1.0\n",
            r"sample 1 \(data_source='src1'\) returned str",
        ),
        ("    return float('nan') if extra_info['index'] == 1 else 1.0\n", r"sample 1 .*returned nan"),
        ("    return float('inf') if extra_info['index'] == 1 else 1.0\n", r"sample 1 .*returned inf"),
    ],
)
def test_custom_bad_result_on_one_sample(smol_tokenizer, tmp_path, caplog, body: str, pattern: str) -> None:
    """One failing sample gets reward_model.failure_score, is counted and named in a warning."""
    path = write(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info):\n" + body)
    batch = make_batch(smol_tokenizer, ["1", "2"], ["1", "2"], ["src0", "src1"])
    with caplog.at_level("WARNING", logger="rlforge.rewards.manager"):
        out = RewardManager(smol_tokenizer, custom_path=path, failure_score=-1.0).score(batch)
    assert out.scores.tolist() == [1.0, -1.0]
    assert out.metrics == {"reward/timeouts": 0.0, "reward/errors": 1.0}
    (line,) = [r.getMessage() for r in caplog.records]
    assert re.search(pattern, line) and "compute_score() in" in line and "failure_score=-1" in line


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        ("    raise ValueError('boom everywhere')\n", r"sample 0 \(data_source='src0'\) raised ValueError: boom"),
        ("    return {'acc': 1.0}\n", r"sample 0 .*without a 'score' key"),
        ("    return None\n", r"sample 0 .*returned NoneType"),
    ],
)
def test_custom_bad_results_on_every_sample_raise(smol_tokenizer, tmp_path, body: str, pattern: str) -> None:
    """A function that fails on every sample of a batch is broken: one error, not silent zeros."""
    path = write(tmp_path, "def compute_score(data_source, solution_str, ground_truth, extra_info):\n" + body)
    batch = make_batch(smol_tokenizer, ["1", "2"], ["1", "2"], ["src0", "src1"])
    with pytest.raises(RewardError, match=pattern) as err:
        RewardManager(smol_tokenizer, custom_path=path).score(batch)
    assert "compute_score() in" in str(err.value) and "my_reward.py" in str(err.value)


def test_unknown_data_source_in_batch(smol_tokenizer) -> None:
    batch = make_batch(smol_tokenizer, ["1"], ["1"], ["mystery/set"])
    with pytest.raises(RewardError, match="mystery/set.*custom_reward_function.path"):
        RewardManager(smol_tokenizer).score(batch)


def test_reward_fn_key(smol_tokenizer) -> None:
    batch = make_batch(smol_tokenizer, ["12"], ["12"], ["ignored"])
    batch.non_tensor["task"] = batch.non_tensor["data_source"].copy()
    batch.non_tensor["task"][0] = "rlforge/arithmetic"
    assert RewardManager(smol_tokenizer, reward_fn_key="task").score(batch).scores.tolist() == [1.0]
    with pytest.raises(RewardError, match="'nokey'"):
        RewardManager(smol_tokenizer, reward_fn_key="nokey").score(batch)


def test_build_from_config(smol_tokenizer, tmp_path) -> None:
    path = write(tmp_path, "def f(data_source, solution_str, ground_truth, extra_info):\n    return 2.0\n")
    cfg = rm_config(path)
    mgr = build_reward_manager(cfg, smol_tokenizer)
    assert mgr.score(make_batch(smol_tokenizer, ["x"], ["y"], ["z"])).scores.tolist() == [2.0]
    cfg.reward_model.reward_manager = "primo"
    with pytest.raises(ConfigError) as err:
        build_reward_manager(cfg, smol_tokenizer)
    msg = str(err.value)
    assert "\n" not in msg and "reward_model.reward_manager" in msg and "'primo'" in msg
    assert "Valid names: batch, dapo, naive, prime" in msg


def test_reward_kwargs_reach_the_function(smol_tokenizer, tmp_path) -> None:
    path = write(tmp_path, "def f(data_source, solution_str, ground_truth, extra_info, scale=1.0, bonus=0.0):\n"
                           "    return scale * len(solution_str) + bonus\n")
    cfg = rm_config(path, reward_kwargs={"scale": 10.0, "bonus": 0.5})
    out = build_reward_manager(cfg, smol_tokenizer).score(make_batch(smol_tokenizer, ["ab"], ["y"], ["z"]))
    assert out.scores.tolist() == [20.5]

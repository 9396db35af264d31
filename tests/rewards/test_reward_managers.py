"""verl's reward managers (naive, batch, prime, dapo), the per-sample timeout and dead workers.

The scorers here sleep or kill their process on purpose; every pool is closed by the manager's
``close()``.  Timings are bounds that show the timeout works, not performance assertions.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch
from reward_helpers import make_batch, rm_config, write

from rlforge.rewards import REWARD_MANAGERS, RewardManager, ScorerPool, build_reward_manager

SLEEPY = (
    "import time\n"
    "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
    "    if extra_info['index'] == 1:\n"
    "        time.sleep(30)\n"
    "    return float(solution_str == ground_truth)\n"
)
KILLER = (
    "import os\n"
    "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
    "    if extra_info['index'] == 2:\n"
    "        os._exit(3)\n"
    "    return float(len(solution_str)) + extra_info['index']\n"
)
CPU = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info, offset=0.0):\n"
    "    total = sum(i * i for i in range(20000))  # some CPU work\n"
    "    return {'score': float(solution_str == ground_truth) + offset + total * 0.0, 'pred': solution_str}\n"
)


def test_registry_names() -> None:
    assert REWARD_MANAGERS.names() == ["batch", "dapo", "naive", "prime"]


@pytest.mark.e2e
def test_sleeping_scorer_times_out(smol_tokenizer, tmp_path, caplog) -> None:
    """A scorer sleeping 30 s under timeout_s=2 costs ~2 s, scores failure_score and is counted."""
    mgr = RewardManager(smol_tokenizer, custom_path=write(tmp_path, SLEEPY), timeout_s=2.0, failure_score=-0.5)
    batch = make_batch(smol_tokenizer, ["1", "2", "3"], ["1", "0", "3"], ["a", "slow/src", "c"])
    try:
        with caplog.at_level(logging.WARNING, logger="rlforge.rewards.manager"):
            t0 = time.monotonic()
            out = mgr.score(batch)
            first = time.monotonic() - t0
            t0 = time.monotonic()
            again = mgr.score(batch)  # the killed worker was replaced; the next step is as quick
            second = time.monotonic() - t0
    finally:
        mgr.close()
    print(f"reward stage with a 30 s sleeper, timeout_s=2: {first:.2f} s, then {second:.2f} s")
    assert first <= 3.0 + 1.0 and second <= 3.0 + 1.0  # generous bound over the 2 s limit (2 shared cores)
    assert out.scores.tolist() == [1.0, -0.5, 1.0] and again.scores.tolist() == [1.0, -0.5, 1.0]
    assert out.metrics == {"reward/timeouts": 1.0, "reward/errors": 0.0}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2 and "sample 1 (data_source='slow/src') timed out after 2 s" in lines[0]


@pytest.mark.e2e
def test_prime_matches_naive(smol_tokenizer, tmp_path) -> None:
    """prime over 4 processes gives the same scores and extras as naive, in order."""
    path = write(tmp_path, CPU)
    texts = [str(i % 5) for i in range(24)]
    truths = [str(i % 3) for i in range(24)]
    batch = make_batch(smol_tokenizer, texts, truths, [f"src{i % 2}" for i in range(24)])
    naive = RewardManager(smol_tokenizer, custom_path=path, reward_kwargs={"offset": 0.25})
    prime = REWARD_MANAGERS.get("prime")(smol_tokenizer, custom_path=path, reward_kwargs={"offset": 0.25},
                                         num_workers=4)
    try:
        a, b = naive.score(batch), prime.score(batch)
        assert prime._pool is not None and len(prime._pool._workers) == 4
    finally:
        prime.close()
    assert torch.equal(a.scores, b.scores) and torch.equal(a.token_level_scores, b.token_level_scores)
    assert a.extra_text == b.extra_text and a.scores.sum() > 0
    assert b.metrics == {"reward/timeouts": 0.0, "reward/errors": 0.0}


@pytest.mark.e2e
def test_prime_worker_killed_mid_batch_is_replaced(smol_tokenizer, tmp_path, caplog) -> None:
    path = write(tmp_path, KILLER)
    batch = make_batch(smol_tokenizer, ["a", "bb", "ccc", "dddd", "e", "ff"], ["x"] * 6, ["s"] * 6)
    prime = REWARD_MANAGERS.get("prime")(smol_tokenizer, custom_path=path, num_workers=2, failure_score=-1.0)
    try:
        with caplog.at_level(logging.WARNING, logger="rlforge.rewards.manager"):
            out = prime.score(batch)
            again = prime.score(batch)
        # one dead worker per batch, each replaced by a fresh fork when a task needed its slot
        assert prime._pool.num_replaced == 2
        assert all(w is None or w.proc.is_alive() for w in prime._pool._workers)
    finally:
        prime.close()
    assert out.scores.tolist() == [1.0, 3.0, -1.0, 7.0, 5.0, 7.0] == again.scores.tolist()
    assert out.metrics == {"reward/timeouts": 0.0, "reward/errors": 1.0}
    assert "sample 2 (data_source='s'): worker process died (exit code 3)" in caplog.records[0].getMessage()


@pytest.mark.e2e
def test_pool_timeout_then_death_then_results() -> None:
    """The pool alone: a stuck task, a dying task and normal tasks in one map, over 2 workers."""

    def fn(x: int) -> int:
        import os

        if x == 0:
            time.sleep(30)
        if x == 1:
            os._exit(1)
        return x * x

    pool = ScorerPool(fn, num_workers=2, timeout_s=1.0)
    try:
        t0 = time.monotonic()
        out = pool.map([{"x": i} for i in range(6)])
        assert time.monotonic() - t0 < 20.0  # the stuck task sleeps 30 s; margin for a loaded CI
    finally:
        pool.close()
    assert out[0].timed_out and not out[0].ok
    assert not out[1].ok and "died" in out[1].error
    assert [o.value for o in out[2:]] == [4, 9, 16, 25]


BATCH_FN = (
    "def compute_score(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):\n"
    "    return [scale * float(s == g) if d != 'dict' else {'score': 2.0, 'acc': 1.0}\n"
    "            for d, s, g in zip(data_sources, solution_strs, ground_truths)]\n"
)


def test_batch_manager_takes_lists(smol_tokenizer, tmp_path) -> None:
    cfg = rm_config(write(tmp_path, BATCH_FN), name="compute_score", manager="batch",
                    reward_kwargs={"scale": 3.0})
    mgr = build_reward_manager(cfg, smol_tokenizer)
    out = mgr.score(make_batch(smol_tokenizer, ["1", "2", "3"], ["1", "0", "3"], ["a", "b", "dict"]))
    assert out.scores.tolist() == [3.0, 0.0, 2.0]
    assert out.extra["acc"][2] == 1.0


def test_batch_manager_wrong_length_is_one_error(smol_tokenizer, tmp_path) -> None:
    from rlforge.errors import RewardError

    path = write(tmp_path, "def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
                           "    return [1.0]\n")
    mgr = build_reward_manager(rm_config(path, name="compute_score", manager="batch"), smol_tokenizer)
    with pytest.raises(RewardError, match="returned list of length 1, expected a list of 2 scores"):
        mgr.score(make_batch(smol_tokenizer, ["1", "2"], ["1", "2"], ["a", "b"]))


@pytest.mark.e2e
def test_batch_manager_timeout(smol_tokenizer, tmp_path) -> None:
    path = write(tmp_path, "import time\ndef compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
                           "    time.sleep(30)\n")
    mgr = build_reward_manager(rm_config(path, name="compute_score", manager="batch", timeout_s=1.0),
                               smol_tokenizer)
    try:
        t0 = time.monotonic()
        out = mgr.score(make_batch(smol_tokenizer, ["1", "2"], ["1", "2"], ["a", "b"]))
        assert time.monotonic() - t0 < 20.0  # the scorer sleeps 30 s; margin for a loaded CI
    finally:
        mgr.close()
    assert out.scores.tolist() == [0.0, 0.0] and out.metrics["reward/timeouts"] == 2.0


def test_dapo_adds_acc_and_overlong(smol_tokenizer, tmp_path) -> None:
    path = write(tmp_path, "def f(data_source, solution_str, ground_truth, extra_info):\n"
                           "    return float(solution_str == ground_truth)\n")
    cfg = rm_config(path, manager="dapo")
    cfg.reward_model.overlong_buffer = type(cfg.reward_model)(enable=True, len=4, penalty_factor=1.0)
    mgr = build_reward_manager(cfg, smol_tokenizer)
    out = mgr.score(make_batch(smol_tokenizer, ["1", "2"], ["1", "0"], ["a", "b"], width=12))
    lengths = make_batch(smol_tokenizer, ["1", "2"], ["1", "0"], ["a", "b"])["response_mask"].sum(-1)
    assert out.extra["acc"] == [1.0, 0.0]
    assert out.extra["overlong_reward"] == [min(0.0, -(int(n) - 4) / 4) for n in lengths]


def test_non_finite_extra_is_left_out_with_one_warning(smol_tokenizer, tmp_path, caplog) -> None:
    """A NaN/inf in a dict's extra key does not reach reward_extra/<key>: it is dropped like a missing value, and
    one warning names the function file, the key and the first sample; finite values of the key are kept."""
    path = write(tmp_path, "def f(data_source, solution_str, ground_truth, extra_info):\n"
                           "    i = extra_info['index']\n"
                           "    return {'score': 1.0, 'acc': [float('nan'), 0.5, float('inf')][i]}\n")
    mgr = RewardManager(smol_tokenizer, custom_path=path, custom_name="f")
    with caplog.at_level(logging.WARNING, logger="rlforge.rewards.manager"):
        out = mgr.score(make_batch(smol_tokenizer, ["1", "2", "3"], ["1", "2", "3"], ["a", "b", "c"]))
    assert out.scores.tolist() == [1.0, 1.0, 1.0]
    assert out.extra["acc"][1] == 0.5 and all(v != v for v in (out.extra["acc"][0], out.extra["acc"][2]))
    (line,) = [r.getMessage() for r in caplog.records]
    assert str(path) in line and "'acc'" in line and "2 of 3 samples" in line and "sample 0" in line


def test_all_zero_scores_with_float_ground_truths_warn_once(smol_tokenizer, tmp_path, caplog) -> None:
    path = write(tmp_path, "def f(data_source, solution_str, ground_truth, extra_info):\n"
                           "    return float(solution_str == str(ground_truth))\n")
    mgr = RewardManager(smol_tokenizer, custom_path=path, custom_name="f")
    batch = make_batch(smol_tokenizer, ["7", "3"], ["x", "y"], ["a", "b"])
    batch.non_tensor["ground_truth"][:] = [7.0, 3.0]
    with caplog.at_level(logging.WARNING, logger="rlforge.rewards.manager"):
        assert mgr.score(batch).scores.tolist() == [0.0, 0.0]
        mgr.score(batch)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "reward_model.ground_truth" in line and "float" in line


def test_float_ground_truth_gsm8k_scores_one(smol_tokenizer) -> None:
    """GSM8K rule: ground truth 7.0 (a float column) matches '#### 7'."""
    batch = make_batch(smol_tokenizer, ["3 + 4 = 7\n#### 7", "#### 8"], ["x", "y"], ["openai/gsm8k"] * 2, width=24)
    batch.non_tensor["ground_truth"][:] = [7.0, 7.0]
    assert RewardManager(smol_tokenizer).score(batch).scores.tolist() == [1.0, 0.0]


def test_bad_timeout_and_workers(smol_tokenizer, tmp_path: Path) -> None:
    from rlforge.errors import ConfigError

    with pytest.raises(ConfigError, match="reward_model.timeout_s=0"):
        build_reward_manager(rm_config(None, timeout_s=0), smol_tokenizer)
    with pytest.raises(ConfigError, match="reward_model.num_workers=-1"):
        build_reward_manager(rm_config(None, num_workers=-1), smol_tokenizer)


@pytest.mark.e2e
def test_training_step_with_sleeping_scorer(tmp_path: Path) -> None:
    """Every sample's scorer sleeps 30 s; prime with 8 workers and timeout_s=2: each step's reward
    stage takes ~2 s (bound 4 s on 2 shared cores) and logs reward/timeouts = 8."""
    import json

    from helpers import FAST, SMALL

    from rlforge.cli import main

    fn = tmp_path / "sleepy.py"
    fn.write_text("import time\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    time.sleep(30)\n    return 1.0\n")
    rc = main(["train", *SMALL, *FAST, f"trainer.default_local_dir={tmp_path / 'run'}", "trainer.total_training_steps=2",
               f"custom_reward_function.path={fn}", "reward_model.reward_manager=prime", "reward_model.num_workers=8",
               "reward_model.timeout_s=2", "reward_model.failure_score=0"])
    assert rc == 0
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    print("timing_s/reward per step:", [round(r["timing_s/reward"], 2) for r in rows])
    assert [r["reward/timeouts"] for r in rows] == [8.0, 8.0] and [r["reward/errors"] for r in rows] == [0.0, 0.0]
    assert all(r["timing_s/reward"] <= 4.0 for r in rows)
    assert all(r["critic/score/mean"] == 0.0 for r in rows)


@pytest.mark.parametrize(("override", "fragments"), [
    ("reward_model.reward_manager=primo", ("reward_model.reward_manager", "'primo'", "Did you mean 'prime'?",
                                           "Valid names: batch, dapo, naive, prime")),
    ("reward_model.timeout_s=-1", ("reward_model.timeout_s", "-1", "null (no limit) or > 0 seconds")),
])
def test_bad_reward_keys_are_one_error_line(capfd, override: str, fragments: tuple[str, ...]) -> None:
    """Refused while the config is validated, before a model loads: status 2 and one error line."""
    from helpers import SMALL

    from rlforge.cli import main

    capfd.readouterr()
    assert main(["train", *SMALL, override]) == 2
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("rlforge: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(f in lines[0] for f in fragments), lines[0]


def test_slow_sample_without_timeout_warns(smol_tokenizer, tmp_path, caplog, monkeypatch) -> None:
    """No timeout_s: a slow sample cannot be stopped, but it is named, with the key to set."""
    import rlforge.rewards.manager as manager

    monkeypatch.setattr(manager, "SLOW_SAMPLE_S", 0.05)
    path = write(tmp_path, "import time\ndef compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                           "    time.sleep(0.2 if extra_info['index'] == 1 else 0.0)\n    return 1.0\n")
    with caplog.at_level(logging.WARNING, logger="rlforge.rewards.manager"):
        out = RewardManager(smol_tokenizer, custom_path=path).score(
            make_batch(smol_tokenizer, ["1", "2"], ["1", "2"], ["a", "slow"]))
    assert out.scores.tolist() == [1.0, 1.0]
    (line,) = [r.getMessage() for r in caplog.records]
    assert "sample 1 (data_source='slow')" in line and "reward_model.timeout_s" in line

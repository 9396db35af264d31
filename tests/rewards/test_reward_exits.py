"""A reward function that calls ``sys.exit`` or raises ``KeyboardInterrupt`` stops the run with one
RewardError naming the function and the sample, in every manager and execution path (in the trainer's
process, in the ``timeout_s`` worker, in the ``prime`` pool); a real Ctrl-C stays a Ctrl-C."""

from __future__ import annotations

import importlib
import signal
import subprocess

import numpy as np
import pytest
import torch
from helpers import user_error
from reward_helpers import make_batch, rm_config, write

from rlforge.errors import RewardError
from rlforge.rewards import REWARD_MANAGERS, RewardManager, build_reward_manager, call_reward_fn

EXITS_ON_1 = (
    "import sys\n"
    "def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
    "    if extra_info['index'] == 1:\n"
    "        {action}\n"
    "    return 1.0\n"
)
BATCH_EXITS = (
    "import sys\n"
    "def compute_score(data_sources, solution_strs, ground_truths, extra_infos):\n"
    "    {action}\n"
)
SYS_EXIT_0 = "sys.exit(0)"
KBD = "raise KeyboardInterrupt"


def _batch(tok):
    return make_batch(tok, ["1", "2", "3"], ["1", "2", "3"], ["a", "src/b", "c"])


@pytest.mark.parametrize("timeout_s", [pytest.param(None, id="in-process"),
                                       pytest.param(5.0, id="worker", marks=pytest.mark.e2e)])
@pytest.mark.parametrize(("action", "said"), [(SYS_EXIT_0, "called sys.exit(0) (SystemExit)"),
                                              (KBD, "raised KeyboardInterrupt")], ids=["sys.exit", "kbd"])
def test_naive_exit_is_one_reward_error(smol_tokenizer, tmp_path, timeout_s, action, said) -> None:
    path = write(tmp_path, EXITS_ON_1.format(action=action))
    mgr = RewardManager(smol_tokenizer, custom_path=path, timeout_s=timeout_s)
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(RewardError) as info:
            mgr.score(_batch(smol_tokenizer))
    finally:
        mgr.close()
    msg = str(info.value)
    assert "\n" not in msg
    assert f"compute_score() in {path} on sample 1 (data_source='src/b') {said}" in msg
    assert "not end the process" in msg
    assert signal.getsignal(signal.SIGINT) is before  # the Ctrl-C handler is put back


@pytest.mark.e2e
def test_prime_pool_exit_is_one_reward_error(smol_tokenizer, tmp_path) -> None:
    """Old code: the pool caught SystemExit as the sample's error and scored it failure_score."""
    path = write(tmp_path, EXITS_ON_1.format(action="sys.exit(3)"))
    mgr = REWARD_MANAGERS.get("prime")(smol_tokenizer, custom_path=path, num_workers=2, failure_score=-1.0)
    try:
        with pytest.raises(RewardError, match=r"on sample 1 \(data_source='src/b'\) called sys.exit\(3\)"):
            mgr.score(_batch(smol_tokenizer))
    finally:
        mgr.close()


@pytest.mark.parametrize("timeout_s", [pytest.param(None, id="in-process"),
                                       pytest.param(5.0, id="worker", marks=pytest.mark.e2e)])
def test_batch_manager_exit_is_one_reward_error(smol_tokenizer, tmp_path, timeout_s) -> None:
    path = write(tmp_path, BATCH_EXITS.format(action="sys.exit('bye')"))
    cfg = rm_config(path, name="compute_score", manager="batch", timeout_s=timeout_s)
    mgr = build_reward_manager(cfg, smol_tokenizer)
    try:
        with pytest.raises(RewardError) as info:
            mgr.score(_batch(smol_tokenizer))
    finally:
        mgr.close()
    assert (f"compute_score() in {path} on a batch of 3 samples (data_source='a', 'c', 'src/b') "
            "called sys.exit('bye') (SystemExit)") in str(info.value)


def test_call_reward_fn_exit(tmp_path) -> None:
    def fn(**_):
        raise SystemExit(2)

    with pytest.raises(RewardError, match=r"my_fn on sample 4 \(data_source='d'\) called sys.exit\(2\)"):
        call_reward_fn(fn, "my_fn", 4, "d", "x", "1", None)


def test_real_ctrl_c_is_still_ctrl_c(smol_tokenizer) -> None:
    """SIGINT delivered while the function runs in the trainer's process: KeyboardInterrupt as before."""

    def fn(data_source, solution_str, ground_truth, extra_info):
        if extra_info["index"] == 1:
            signal.raise_signal(signal.SIGINT)
        return 1.0

    mgr = RewardManager(smol_tokenizer)
    mgr.fn = fn
    # Python's own Ctrl-C handler, as in `rlforge train`: a pytest worker may have inherited another one
    original = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            mgr.score(_batch(smol_tokenizer))
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, original)


# ---------------------------------------------------------------- batch functions returning arrays

@pytest.mark.parametrize("make", [
    lambda v: np.asarray(v), lambda v: np.asarray(v, dtype=np.float32), lambda v: torch.tensor(v),
    lambda v: [np.float64(x) for x in v], lambda v: tuple(v),
], ids=["ndarray", "ndarray-f32", "tensor", "numpy-scalars", "tuple"])
def test_batch_function_may_return_arrays(smol_tokenizer, make) -> None:
    mgr = REWARD_MANAGERS.get("batch")(smol_tokenizer)
    mgr.fn = lambda data_sources, solution_strs, ground_truths, extra_infos: make([0.5, 0.0, 2.0])
    assert mgr.score(_batch(smol_tokenizer)).scores.tolist() == [0.5, 0.0, 2.0]


@pytest.mark.parametrize(("value", "said"), [
    (np.zeros(2), "returned list of length 2, expected a list of 3 scores"),
    (np.zeros((3, 1)), "returned ndarray of shape (3, 1), expected a 1-D list of 3 scores"),
    (torch.zeros(4), "returned list of length 4, expected a list of 3 scores"),
    (np.float64(1.0), "returned float64 of shape (), expected a 1-D list of 3 scores"),
])
def test_batch_function_bad_shape_is_one_error(smol_tokenizer, value, said) -> None:
    mgr = REWARD_MANAGERS.get("batch")(smol_tokenizer)
    mgr.fn = lambda data_sources, solution_strs, ground_truths, extra_infos: value
    with pytest.raises(RewardError) as info:
        mgr.score(_batch(smol_tokenizer))
    assert "on a batch of 3 samples" in str(info.value) and said in str(info.value)


def test_batch_function_non_finite_array_value(smol_tokenizer) -> None:
    """A NaN in the array fails that sample (named, with the function), as a NaN in a list does."""
    mgr = REWARD_MANAGERS.get("batch")(smol_tokenizer, failure_score=-1.0)
    mgr.fn = lambda data_sources, solution_strs, ground_truths, extra_infos: np.array([1.0, np.nan, 0.0])
    out = mgr.score(_batch(smol_tokenizer))
    assert out.scores.tolist() == [1.0, -1.0, 0.0] and out.metrics["reward/errors"] == 1.0
    mgr.fn = lambda data_sources, solution_strs, ground_truths, extra_infos: np.full(3, np.inf)
    with pytest.raises(RewardError, match=r"on sample 0 \(data_source='a'\) returned inf, expected a finite"):
        mgr.score(_batch(smol_tokenizer))


# ---------------------------------------------------------------- the whole command

@pytest.mark.e2e
def test_rlforge_train_with_exiting_reward_fails(tmp_path, capfd) -> None:
    """``rlforge train`` whose reward function calls sys.exit(0): status 2 and one error line, not status 0
    with no step.  Runs ``main`` in this process (as tests/cli/test_cli_errors.py's ``in_process``)."""
    fn = tmp_path / "reward.py"
    fn.write_text("import sys\ndef compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                  "    sys.exit(0)\n")
    args = ["train", "actor_rollout_ref.model.path=preset:tiny", "trainer.device=cpu", "data.val_files=null",
            "data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "data.max_response_length=2",
            "trainer.total_training_steps=1", "trainer.logger=[file]",
            f"trainer.default_local_dir={tmp_path / 'run'}", f"custom_reward_function.path={fn}"]
    main = importlib.import_module("rlforge.cli").main
    capfd.readouterr()
    status = main(args)
    out, err = capfd.readouterr()
    user_error(subprocess.CompletedProcess(args, status, out, err), "sample 0", "rlforge/arithmetic",
               "called sys.exit(0)")


@pytest.mark.parametrize("value", [10**400, -(10**400), {"score": 10**400}], ids=["int", "negative", "dict"])
def test_int_too_large_for_a_float_is_one_reward_error(value) -> None:
    with pytest.raises(RewardError, match="expected a finite number") as e:
        call_reward_fn(lambda **kw: value, "f", 3, "ds", "s", "1", {})
    assert "sample 3" in str(e.value)


_OS_EXIT_CHILD = """
import sys
sys.path.insert(0, {tests!r})
from reward_helpers import make_batch
from rlforge.errors import RewardError
from rlforge.models import load_tokenizer
from rlforge.rewards import build_reward_manager
from reward_helpers import rm_config
tok = load_tokenizer("preset:tiny")
mgr = build_reward_manager(rm_config({path!r}, name="compute_score", manager={manager!r}), tok)
try:
    mgr.score(make_batch(tok, ["1", "2", "3"], ["1", "2", "3"], ["a", "src/b", "c"]))
except RewardError as e:
    print(e)
    sys.exit(7)
"""


@pytest.mark.e2e
@pytest.mark.parametrize("manager, body", [("naive", EXITS_ON_1.format(action="import os; os._exit(0)")),
                                           ("batch", BATCH_EXITS.format(action="import os; os._exit(0)"))],
                         ids=["naive", "batch"])
def test_os_exit_in_a_reward_function_is_one_reward_error(tmp_path, manager, body) -> None:
    """Old code: os._exit(0) in the trainer's process ended it at once, status 0, nothing printed."""
    import os
    import sys
    from pathlib import Path

    path = write(tmp_path, body)
    tests = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(tests).parent), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _OS_EXIT_CHILD.format(tests=tests, path=path, manager=manager)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 7, (done.returncode, done.stdout, done.stderr[-2000:])
    assert "called os._exit(0)" in done.stdout and "not end the process" in done.stdout

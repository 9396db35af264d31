"""Partial rollout (``rlforge.trainer.partial_rollout``): whole groups, exact carry-over, staleness
masks and metrics, checkpointed pools (nothing lost or trained twice), its config errors, and, with
nothing over-provisioned, a run identical to the synchronous trainer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import FAST, SMALL

from rlforge.config import load_config, validate_config
from rlforge.data.loader import collate_prompts
from rlforge.errors import ConfigError
from rlforge.rollout import SamplingParams
from rlforge.rollout.native import NativeRollout
from rlforge.rollout.native.forced_eos import ENV
from rlforge.trainer.partial_rollout import PartialRollout, staleness_metrics

N, WANT = 2, 3
LENGTHS = "def length(prompt_ids, sample_index):\n    return 1 + (7 * len(prompt_ids) + 5 * sample_index) % 9\n"


class Loader:
    """Prompts ``[i + 10, ..]`` of length 2 + i % 4, ``index`` i, in batches of ``WANT``."""

    pad_token_id = 0

    def __init__(self, position: int = 0) -> None:
        self.position = position

    def next_batch(self):
        items = [{"input_ids": torch.arange(i + 10, i + 12 + i % 4), "data_source": "t", "ground_truth": "",
                  "extra_info": {"index": i}, "raw_prompt": "", "ability": ""}
                 for i in range(self.position, self.position + WANT)]
        self.position += WANT
        return collate_prompts(items, self.pad_token_id)


@pytest.fixture
def engine(tiny_model, tiny_tokenizer, tmp_path, monkeypatch):
    hook = tmp_path / "lengths.py"
    hook.write_text(LENGTHS)
    monkeypatch.setenv(ENV, f"{hook}:length")
    return NativeRollout(tiny_model, [tiny_tokenizer.eos_token_id], tiny_tokenizer.pad_token_id, torch.device("cpu"),
                         progress=False, calculate_log_probs=True, max_decode_burst=1, seed=0)


GREEDY = SamplingParams(do_sample=False, max_new_tokens=8)


def _pool(engine, loader, extra=3, max_gap=None, mode="mask") -> PartialRollout:
    return PartialRollout(engine, loader, N, WANT, extra, max_gap, mode)


def test_groups_whole_and_carried_tokens_continue_exactly(engine):
    pr = _pool(engine, Loader())
    trained: list[int] = []
    seen_carry = False
    for version in range(4):
        before = {(g.fields["uid"], j): list(r.tokens) for g in pr.pool for j, r in enumerate(g.responses)}
        b = pr.collect(version, GREEDY, m := {})
        assert len(b) == WANT * N
        uids = list(b.non_tensor["uid"])
        assert all(uids[i] == uids[i + 1] for i in range(0, len(uids), N))  # n rows per group, together
        assert len(set(uids)) == WANT
        for i, uid in enumerate(uids):
            old = before.get((uid, i % N), [])
            resp = b["responses"][i][: int(b["response_mask"][i].sum())].tolist()
            assert resp[: len(old)] == old  # continued from its exact tokens
            v = b["rollout_param_versions"][i][: len(resp)].tolist()
            assert v == sorted(v) and (not old or v[: len(old)] != [version] * len(old) or version == 0)
            seen_carry |= bool(old) and version > 0
        trained += [int(x["index"]) for x in b.non_tensor["extra_info"][::N]]
        assert m["fully_async/pool_groups"] == len(pr.pool)
    assert seen_carry  # the lengths make some responses outlive a step
    assert len(trained) == len(set(trained))  # no prompt trained twice
    pooled = [g.fields["extra_info"]["index"] for g in pr.pool]
    assert sorted(trained + pooled) == list(range(pr.loader.position))  # none lost


def test_resume_mid_carry_over_continues_the_same_responses(engine):
    a = _pool(engine, Loader())
    a.collect(0, GREEDY, {})
    assert any(r.tokens and not r.done for g in a.pool for r in g.responses)  # a carry-over is in flight
    state = json.loads(json.dumps(a.state_dict()))  # plain data, as a checkpoint holds it
    b = _pool(engine, Loader(a.loader.position))
    b.load_state_dict(state)
    for version in (1, 2):
        x, y = a.collect(version, GREEDY, {}), b.collect(version, GREEDY, {})
        for k in ("responses", "response_mask", "rollout_param_versions"):
            assert torch.equal(x[k], y[k]), k
        assert [e["index"] for e in x.non_tensor["extra_info"]] == [e["index"] for e in y.non_tensor["extra_info"]]


def test_stale_tokens_masked_or_dropped(engine):
    pr = _pool(engine, Loader(), max_gap=0, mode="mask")
    pr.collect(0, GREEDY, {})
    b = pr.collect(5, GREEDY, m := {})
    gap = 5 - b["rollout_param_versions"]
    assert "rollout_response_mask" in b  # some trained tokens were sampled at version 0
    assert torch.equal(b["response_mask"], b["rollout_response_mask"] * (gap <= 0).long())
    assert m["fully_async/staleness/stale_token_frac"] == m["fully_async/staleness/off_policy_token_frac"]
    pr = _pool(engine, Loader(), max_gap=0, mode="drop")
    pr.collect(0, GREEDY, {})
    carried = sum(bool(r.tokens) for g in pr.pool for r in g.responses)  # ended or not: all hold v0 tokens
    b = pr.collect(5, GREEDY, m := {})
    assert m["fully_async/dropped_stale_responses"] == carried > 0
    assert bool((b["rollout_param_versions"][b["response_mask"].bool()] == 5).all())


def test_staleness_metrics_hand_computed():
    versions = torch.tensor([[3, 3, 3, 0], [1, 2, 3, 3]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    m = staleness_metrics(versions, mask, 3, 1)
    # trained tokens' gaps: 0,0,0 | 2,1,0,0 -> 7 tokens, 2 off-policy, 1 beyond a bound of 1
    assert m["fully_async/staleness/off_policy_token_frac"] == pytest.approx(2 / 7)
    assert m["fully_async/staleness/stale_token_frac"] == pytest.approx(1 / 7)
    assert m["fully_async/staleness/max_version_gap"] == 2
    assert m["fully_async/staleness/gap_0"] == pytest.approx(5 / 7)
    assert m["fully_async/partial/total_partial_num"] == 1 and m["fully_async/partial/partial_ratio"] == 0.5
    assert m["fully_async/partial/max_partial_span"] == 2


def _cfg(*o: str):
    cfg = load_config([*SMALL, *o])
    validate_config(cfg)
    return cfg


def test_bad_input_one_error_each():
    with pytest.raises(ConfigError, match=r"^async_training\.max_version_gap=-1: must be >= 0"):
        _cfg("async_training.max_version_gap=-1")
    with pytest.raises(ConfigError, match=r"rollout\.n=1 with algorithm\.adv_estimator=grpo"):
        _cfg("async_training.partial_rollout=true", "async_training.staleness_threshold=0.5",
             "actor_rollout_ref.rollout.n=1", "algorithm.adv_estimator=grpo")
    with pytest.raises(ConfigError, match="async_training.stale_mode='x'"):
        _cfg("async_training.stale_mode=x")
    _cfg("async_training.partial_rollout=true", "async_training.staleness_threshold=0.5")  # n=2: fine


def _run(tmp: Path, *extra: str) -> list[dict]:
    from rlforge.cli import main

    assert main(["train", *SMALL, *FAST, "actor_rollout_ref.rollout.name=native", "trainer.total_training_steps=3",
                 f"trainer.default_local_dir={tmp}", *extra]) == 0
    return [json.loads(line) for line in (tmp / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.e2e
def test_no_over_provisioning_is_bit_identical_to_the_synchronous_trainer(tmp_path):
    sync = _run(tmp_path / "sync")
    part = _run(tmp_path / "part", "async_training.partial_rollout=true", "async_training.staleness_threshold=0")
    assert len(sync) == len(part) == 3
    for a, b in zip(sync, part, strict=True):
        for k in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "response_length/mean", "actor/entropy"):
            assert a[k] == b[k], k  # exactly
        assert b["fully_async/staleness/off_policy_token_frac"] == 0.0


@pytest.mark.e2e
def test_partial_rollout_run_resumes_its_pool(tmp_path):
    extra = ("async_training.partial_rollout=true", "async_training.staleness_threshold=0.5",
             "data.max_response_length=16", "trainer.save_freq=2",
             "actor_rollout_ref.actor.checkpoint.save_contents=[model,optimizer,extra]")
    rows = _run(tmp_path, *extra, "trainer.total_training_steps=2")
    assert {"fully_async/partial/partial_ratio", "fully_async/staleness/max_version_gap"} <= set(rows[-1])
    state = torch.load(tmp_path / "global_step_2" / "trainer_state.pt", weights_only=False)
    pool = state["partial_rollout"]["pool"]
    assert len(pool) >= 2  # the over-provisioned groups were saved
    rows = _run(tmp_path, *extra, "trainer.total_training_steps=4", "trainer.resume_mode=auto")
    assert [r["step"] for r in rows][-2:] == [3, 4]
    # `rlforge perf report` shows the staleness: the mean off-policy share over the 4 steps the run logged
    from rlforge.perf.report import write_report

    report = write_report(tmp_path).read_text()
    fracs = [r["fully_async/staleness/off_policy_token_frac"] for r in rows]
    assert f"| `fully_async/staleness/off_policy_token_frac` | {sum(fracs) / len(fracs):.4g} | {max(fracs):.4g} |" \
        in report, report

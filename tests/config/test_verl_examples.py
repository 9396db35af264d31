"""verl's example scripts, run through ``rlforge check-config``'s loader (issue 38, item 6).

``tests/fixtures/verl_examples.json`` holds the Hydra overrides of every script under verl's
``examples/`` that launches ``verl.trainer.main_ppo`` at the pinned commit (b178a3c, 2026-01-29,
0.8.0.dev), extracted by ``tests/fixtures/extract_verl_examples.py``.  Every entry is accepted,
apart from the lists below, each of which says why.  A list entry that no script needs any more
fails the test, so that the lists shrink as rlforge grows.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from verl_examples_harness import Outcome, load_fixture, run_entry

PENDING_UNKNOWN_KEYS: dict[str, str] = {}
"""Unknown-key refusals another branch removes: the check re-sends them as ``++key`` and goes on."""

PENDING_REFUSED_VALUES: dict[str, str] = {}
"""Values verl accepts that rlforge refuses until another branch lands: dropped, and the check goes on."""

HARDWARE_REFUSALS: dict[str, tuple[str, str]] = {
    # (this script also sets sp_size after $((.../sp_size)) uses it: its token budgets stay at 16384 < 32768)
    "examples/gspo_trainer/run_qwen3_32b_gspo_npu.sh": ("trainer.device=npu", "Ascend NPU"),
}
"""Scripts whose values name hardware rlforge cannot have: {script: (key=value, what)}.  (verl's rollout
backends, trtllm included, run as rlforge's native engine with a warning.)"""

SCRIPT_FAULTS: dict[str, tuple[str, str]] = {
    "examples/ppo_trainer/run_deepseek7b_llm_pfppo.sh": (
        "override ' ' is not of the form key=value",
        "`\\ ` before a `#` comment ends the command after 3 overrides and passes ' ', which Hydra refuses too"),
    "examples/sglang_multiturn/search_r1_like/run_qwen2.5-3b_instruct_search_multiturn.sh": (
        "actor_rollout_ref.rollout.multi_turn.format='qwen'",
        "search_multiturn_grpo.yaml sets multi_turn.format=qwen; verl registers only the hermes and gpt-oss "
        "tool parsers, so its tool agent loop fails on it too"),
}
"""Scripts that fail in verl too, or only because the script is cut short: {script: (error start, why)}."""

NEEDS_GPUS: dict[str, tuple[str, int]] = {
    # a comment line inside the continuation cuts the command before trainer.n_gpus_per_node=8: verl then runs
    # on its default 8 GPUs of a node; under verl's defaults rlforge takes the node's visible GPUs
    # (rlforge.config.world.node_gpus_from_verl_default), so it is accepted on 8 GPUs and refused on this CPU
    "examples/grpo_trainer/run_qwen3_vl-30b-megatron.sh": (
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2 x", 8),
}
"""Scripts whose layout needs more GPUs than this machine has: {script: (error start here, GPUs it runs on)}."""

RLFORGE_LIMITS: dict[str, tuple[str, str]] = {}
# (examples/router_replay/run_qwen30_a3b_megatron_sglang.sh left this list: 3 prompts x n=8 = 24 samples on
# 48 ranks run in rlforge.config.sharding's replica_samples layout, 3 samples per data-parallel replica)
"""Values verl accepts that rlforge refuses by design: {script: (error start, why)}."""

EXPECTED_REFUSALS = {**{s: (kv + ":", w) for s, (kv, w) in HARDWARE_REFUSALS.items()}, **SCRIPT_FAULTS,
                     **RLFORGE_LIMITS, **{s: (start, f"needs {n} GPUs") for s, (start, n) in NEEDS_GPUS.items()}}


def _outcomes(tmp: Path) -> dict[str, Outcome]:
    entries = load_fixture()
    out = {}
    for n, (script, entry) in enumerate(entries.items()):
        folder = tmp / str(n)
        folder.mkdir()
        out[script] = run_entry(entry, set(PENDING_UNKNOWN_KEYS), set(PENDING_REFUSED_VALUES), folder)
    return out


def test_fixture_covers_verl_examples() -> None:
    entries = load_fixture()
    assert len(entries) == 126  # scripts under examples/ launching verl.trainer.main_ppo at b178a3c
    assert all(e["overrides"] for e in entries.values())
    for script in [*HARDWARE_REFUSALS, *SCRIPT_FAULTS, *RLFORGE_LIMITS, *NEEDS_GPUS]:
        assert script in entries, script


@pytest.mark.parametrize("script", sorted(HARDWARE_REFUSALS))
def test_hardware_and_backend_refusals_are_one_line(script: str, tmp_path: Path) -> None:
    """Each names the key and the value, in one line."""
    entry = load_fixture()[script]
    outcome = run_entry(entry, set(PENDING_UNKNOWN_KEYS), set(PENDING_REFUSED_VALUES), tmp_path)
    key_value, what = HARDWARE_REFUSALS[script]
    assert outcome.error is not None and outcome.error.startswith(key_value + ":"), outcome.error
    assert what in outcome.error and "\n" not in outcome.error


@pytest.mark.parametrize("script", sorted(NEEDS_GPUS))
def test_a_script_that_needs_a_node_is_accepted_on_one(script: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused here (no GPU: one process), accepted where the node's GPUs are visible (verl's default of 8)."""
    entry = load_fixture()[script]
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    start, gpus = NEEDS_GPUS[script]
    refused = run_entry(entry, set(), set(), tmp_path)
    assert refused.error is not None and refused.error.startswith(start), refused.error
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(gpus)))
    assert run_entry(entry, set(), set(), tmp_path).error is None


@pytest.mark.e2e  # ~126 config loads: 15-40 s on a busy 2-core machine
def test_every_verl_example_is_accepted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU, whatever machine runs it: NEEDS_GPUS are refused
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    outcomes = _outcomes(tmp_path)
    wrong = {}
    for script, o in outcomes.items():
        expected = EXPECTED_REFUSALS.get(script)
        if expected is None and o.error is not None:
            wrong[script] = f"refused: {o.error}"
        elif expected is not None and not (o.error or "").startswith(expected[0]):
            wrong[script] = f"expected a refusal starting {expected[0]!r}, got {o.error!r}"
    assert not wrong, "\n".join(f"{s}: {w}" for s, w in wrong.items())
    used_unknown = {k for o in outcomes.values() for k in o.pending_unknown}
    used_values = {k for o in outcomes.values() for k in o.pending_values}
    assert set(PENDING_UNKNOWN_KEYS) <= used_unknown, (
        f"no script is refused for these keys any more; remove them from PENDING_UNKNOWN_KEYS: "
        f"{sorted(set(PENDING_UNKNOWN_KEYS) - used_unknown)}")
    assert set(PENDING_REFUSED_VALUES) <= used_values, (
        f"remove from PENDING_REFUSED_VALUES: {sorted(set(PENDING_REFUSED_VALUES) - used_values)}")
    outright = sum(o.first_error is None for o in outcomes.values())
    print(f"\nverl examples: accepted {outright} of {len(outcomes)} as they are; "
          f"{sum(o.error is None for o in outcomes.values())} with the pending keys set aside; "
          f"{len(EXPECTED_REFUSALS)} expected refusals")

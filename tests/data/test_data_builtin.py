"""The built-in arithmetic task: determinism, held-out validation problems, difficulty and mixes of
levels, and loading by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rlforge.config import load_config, validate_config
from rlforge.data import BUILTIN_TASKS, PromptLoader, load_rl_dataset
from rlforge.data.load import load_rows
from rlforge.data.tasks.arithmetic import LEVELS, evaluate, generate_arithmetic
from rlforge.errors import ConfigError
from rlforge.rewards import default_compute_score


def questions(rows: list[dict]) -> list[str]:
    return [r["prompt"][0]["content"] for r in rows]


def test_registered() -> None:
    """``builtin:arithmetic`` names this module's generator, and a misspelt name lists it."""
    assert BUILTIN_TASKS.get("arithmetic") is generate_arithmetic
    with pytest.raises(ConfigError, match="Did you mean 'arithmetic'"):
        BUILTIN_TASKS.get("arithmetc")


def test_deterministic_and_splits_differ() -> None:
    a = generate_arithmetic(split="train", size=50, difficulty=2, seed=1)
    b = generate_arithmetic(split="train", size=50, difficulty=2, seed=1)
    assert a == b
    val = generate_arithmetic(split="val", size=50, difficulty=2, seed=1)
    assert questions(val) != questions(a)
    assert questions(generate_arithmetic(split="train", size=50, difficulty=2, seed=2)) != questions(a)


def test_row_format_and_exact_answers() -> None:
    rows = generate_arithmetic(split="train", size=200, difficulty=4, seed=0)
    for r in rows:
        assert r["data_source"] == "rlforge/arithmetic"
        assert r["reward_model"]["style"] == "rule"
        expr = r["extra_info"]["expression"]
        assert r["prompt"] == [{"role": "user", "content": f"What is {expr}? Answer with only the number."}]
        assert r["reward_model"]["ground_truth"] == str(eval(expr))  # test-only check of the generator
        assert (
            default_compute_score(
                r["data_source"],
                r["reward_model"]["ground_truth"],
                r["reward_model"]["ground_truth"],
                r["extra_info"],
            )
            == 1.0
        )
    assert evaluate([2, 3, 4], ["+", "*"]) == 14 and evaluate([2, 3, 4], ["*", "-"]) == 2


def test_difficulty_changes_problems() -> None:
    easy = generate_arithmetic(split="train", size=100, difficulty=1, seed=1)
    exprs = [r["extra_info"]["expression"] for r in easy]
    assert all(len(e.split()) == 3 and e.split()[1] == "+" for e in exprs)
    assert all(0 <= int(x) <= 9 for e in exprs for x in e.split()[::2])
    two = [
        r["extra_info"]["expression"]
        for r in generate_arithmetic(split="train", size=100, difficulty=2, seed=1)
    ]
    assert {e.split()[1] for e in two} == {"+", "-"} and all(10 <= int(e.split()[0]) <= 99 for e in two)
    three = [
        r["extra_info"]["expression"]
        for r in generate_arithmetic(split="train", size=100, difficulty=3, seed=1)
    ]
    assert "*" in {e.split()[1] for e in three}
    four = [
        r["extra_info"]["expression"]
        for r in generate_arithmetic(split="train", size=20, difficulty=4, seed=1)
    ]
    assert all(len(e.split()) == 5 for e in four)
    assert set(LEVELS) == {1, 2, 3, 4, 5}
    with pytest.raises(ConfigError, match="data.builtin.difficulty=9"):
        generate_arithmetic(split="train", size=1, difficulty=9, seed=1)
    with pytest.raises(ConfigError, match=r"data.builtin.difficulty=\[1, 9\]"):
        generate_arithmetic(split="train", size=1, difficulty=[1, 9], seed=1)


def test_default_job_validation_prompts_are_not_training_prompts() -> None:
    """The default job's val set is held out: none of its prompts is a training prompt."""
    cfg = load_config(job="default")
    assert cfg.data.train_files == cfg.data.val_files == "builtin:arithmetic"
    train, _ = load_rows(cfg.data.train_files, cfg.data, "train")
    val, _ = load_rows(cfg.data.val_files, cfg.data, "val")
    assert len(train) == cfg.data.builtin.train_size and len(val) == cfg.data.builtin.val_size
    assert set(questions(val)).isdisjoint(questions(train))


def test_level_1_holds_out_some_of_its_100_sums() -> None:
    """At level 1 (100 possible sums) 2000 training rows cover every sum that is not held out, and
    the validation rows only the others."""
    every = {f"{a} + {b}" for a in range(10) for b in range(10)}  # the reference: all level-1 problems
    train = {r["extra_info"]["expression"] for r in generate_arithmetic(split="train", size=2000, difficulty=1, seed=1)}
    val = {r["extra_info"]["expression"] for r in generate_arithmetic(split="val", size=200, difficulty=1, seed=1)}
    assert train | val == every and not train & val
    assert 5 <= len(val) <= 30  # about one in 8


def test_a_list_of_levels_mixes_them_in_turn() -> None:
    rows = generate_arithmetic(split="val", size=10, difficulty=[1, 2], seed=1)
    assert [r["extra_info"]["difficulty"] for r in rows] == [1, 2] * 5
    for r in rows:
        a, op, b = r["extra_info"]["expression"].split()
        digits = 1 if r["extra_info"]["difficulty"] == 1 else 2
        assert len(a) == len(b) == digits and op in ("+", "-") and (digits == 2 or op == "+")
        assert r["reward_model"]["ground_truth"] == str(int(a) + int(b) if op == "+" else int(a) - int(b))
    assert generate_arithmetic(split="val", size=4, difficulty=[2], seed=1) == generate_arithmetic(
        split="val", size=4, difficulty=2, seed=1)


@pytest.mark.parametrize("value", ["[]", "0", "[1,0]", "two", "true"])
def test_bad_difficulty_is_a_config_error(value: str) -> None:
    with pytest.raises(ConfigError, match="data.builtin.difficulty"):
        validate_config(load_config([f"data.builtin.difficulty={value}"]))


def test_load_builtin_by_name(smol_tokenizer) -> None:
    cfg = SimpleNamespace(
        prompt_key="prompt",
        max_prompt_length=64,
        truncation="error",
        filter_overlong_prompts=False,
        seed=1,
        builtin=SimpleNamespace(difficulty=2, train_size=24, val_size=6),
    )
    train = load_rl_dataset("builtin:arithmetic", smol_tokenizer, cfg, split="train")
    val = load_rl_dataset(["builtin:arithmetic"], smol_tokenizer, cfg, split="val")
    assert len(train) == 24 and len(val) == 6
    assert max(it["input_ids"].numel() for it in train) < 64  # short prompts
    batch = PromptLoader(train, batch_size=8, shuffle=True, seed=1, drop_last=True).next_batch()
    assert batch["input_ids"].shape[0] == 8
    assert set(batch.non_tensor["data_source"]) == {"rlforge/arithmetic"}
    with pytest.raises(ConfigError, match="built-in task 'arith'.*arithmetic"):
        load_rl_dataset("builtin:arith", smol_tokenizer, cfg)

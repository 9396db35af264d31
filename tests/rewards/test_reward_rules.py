"""GSM8K (verl parity) and arithmetic rules, and dispatch by data_source."""

from __future__ import annotations

import numpy as np
import pytest

from rlforge.errors import RewardError
from rlforge.rewards import REWARD_RULES, default_compute_score, extract_answer, gsm8k
from rlforge.rewards import arithmetic as arith
from rlforge.rewards.numeric import canonical_number, looks_like_float_column, numbers_equal


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("She sold 48 + 24 = 72 clips.\n#### 72", "72", 1.0),  # correct
        ("She sold 48 + 24 = 70 clips.\n#### 70", "72", 0.0),  # wrong
        ("She sold 72 clips.", "72", 0.0),  # no ####
        ("The total is #### 1,234", "1234", 1.0),  # commas removed
        ("#### 1,234$", "1234", 1.0),  # '$' after the number is not captured
        ("#### $1234", "1234", 0.0),  # verl: '$' right after '#### ' stops the match
        ("It drops by 5.\n#### -5", "-5", 1.0),  # negative
        ("#### 2.5", "2.5", 1.0),
        ("#### 2.50", "2.5", 1.0),  # numbers compared by value (verl compares strings: 0.0)
        ("#### 2.51", "2.5", 0.0),
        ("#### 3\nwait, no.\n#### 4", "4", 1.0),  # the last #### counts
        ("#### 4\nwait, no.\n#### 3", "4", 0.0),
        ("####72", "72", 0.0),  # the space after #### is required
    ],
)
def test_gsm8k_strict(response: str, truth: str, expected: float) -> None:
    assert gsm8k.compute_score(response, truth) == expected


def test_gsm8k_strict_only_reads_last_300_chars() -> None:
    early = "#### 72\n" + "x" * 400
    assert gsm8k.extract_solution(early) is None
    assert gsm8k.compute_score(early, "72") == 0.0
    assert gsm8k.compute_score("x" * 400 + "#### 72", "72") == 1.0


def test_gsm8k_format_score_and_score() -> None:
    assert gsm8k.compute_score("#### 5", "6", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no answer", "6", format_score=0.1) == 0.0
    assert gsm8k.compute_score("#### 6", "6", score=2.0) == 2.0


def test_gsm8k_flexible() -> None:
    assert gsm8k.extract_solution("so 3 then 1,234.", method="flexible") == "1,234."
    assert gsm8k.compute_score("First 12, then 72", "72", method="flexible") == 1.0
    assert gsm8k.compute_score("First 72, then 12", "72", method="flexible") == 0.0
    assert gsm8k.compute_score("The answer is 72 .", "72", method="flexible") == 1.0  # '.' skipped
    assert gsm8k.compute_score("no digits here", "72", method="flexible") == 0.0
    assert gsm8k.extract_solution(". .", method="flexible") is None
    with pytest.raises(ValueError, match="method"):
        gsm8k.extract_solution("1", method="loose")


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("12", "12", 1.0),
        ("  12.\n", "12", 1.0),
        ("12!", "12", 1.0),
        ("-7", "-7", 1.0),
        ("7", "-7", 0.0),
        ("13", "12", 0.0),
        ("012", "12", 0.0),
        ("The answer is 12", "12", 0.0),
        ("12 or 13", "12", 0.0),
        ("", "12", 0.0),
    ],
)
def test_arithmetic_strict(response: str, truth: str, expected: float) -> None:
    assert arith.compute_score(response, truth) == expected


def test_arithmetic_last_int() -> None:
    assert arith.compute_score("7 + 5 = 12", "12", method="last_int") == 1.0
    assert arith.compute_score("12, no 13", "12", method="last_int") == 0.0
    assert arith.compute_score("none", "12", method="last_int") == 0.0


def test_dispatch_by_data_source() -> None:
    assert set(REWARD_RULES.names()) >= {"openai/gsm8k", "rlforge/arithmetic"}
    assert default_compute_score("openai/gsm8k", "#### 72", "72", {}) == 1.0
    assert default_compute_score("openai/gsm8k", "72", "72", {}) == 0.0  # strict mode
    assert default_compute_score("rlforge/arithmetic", "12", "12", None) == 1.0


def test_unknown_data_source() -> None:
    with pytest.raises(RewardError) as err:
        default_compute_score("my/math", "1", "1", {})
    msg = str(err.value)
    assert "'my/math'" in msg and "openai/gsm8k" in msg and "rlforge/arithmetic" in msg
    assert "custom_reward_function.path" in msg


@pytest.mark.parametrize("truth", [7.0, 7, "7", "7.0", " 7 ", np.float64(7.0), np.int64(7), np.float32(7.0)])
def test_numeric_ground_truths_compare_equal(truth) -> None:
    """A float column (pandas writes int columns with a missing value as float64) still matches."""
    assert default_compute_score("openai/gsm8k", "so 3 + 4 = 7\n#### 7", truth, None) == 1.0
    assert default_compute_score("openai/gsm8k", "#### 7.0", truth, None) == 1.0
    assert default_compute_score("openai/gsm8k", "#### 8", truth, None) == 0.0
    assert default_compute_score("rlforge/arithmetic", "3 + 4 = 7", truth, None) == 1.0
    assert arith.compute_score("7", truth) == 1.0 and arith.compute_score("07", truth) == 0.0


def test_numeric_helpers() -> None:
    assert canonical_number(7.0) == "7" and canonical_number("7.00") == "7" and canonical_number(2.50) == "2.5"
    assert canonical_number("abc ") == "abc" and canonical_number(True) == "True"
    assert numbers_equal("1,234", 1234.0) and not numbers_equal("7", "7.5") and numbers_equal("x", " x")
    assert looks_like_float_column([7.0, np.float64(3.0)]) and looks_like_float_column(["7.0", "3.00"])
    assert not looks_like_float_column(["7", "3.0"]) and not looks_like_float_column([]) \
        and not looks_like_float_column([7])


def test_extract_answer_for_majority_vote() -> None:
    assert extract_answer("openai/gsm8k", "#### 7.0") == "7" and extract_answer("openai/gsm8k", "7") is None
    assert extract_answer("rlforge/arithmetic", "3 + 4 = 7") == "7"
    assert extract_answer("unknown/source", "7") is None


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("#### 1000000001", "1000000000", 0.0),  # a relative tolerance of 1e-9 called these equal
        ("#### 1000000000", "1000000000", 1.0),
        ("#### 1,000,000,001", 1000000001, 1.0),
        (f"#### {2**60 + 1}", str(2**60), 0.0),  # through a float both are 2**60
        (f"#### {2**60 + 1}", 2**60 + 1, 1.0),
        ("#### 1.50", "1.5", 1.0),
        ("#### 0.30000000000000004", "0.3", 0.0),  # decimal values differ
        ("#### 1,000", "1000", 1.0),
        ("#### 1000.", "1000", 1.0),  # a trailing period
        ("#### .5", "0.5", 1.0),
        ("#### 1.2.3", "1.2.3", 1.0),  # not a number: compared as strings
        ("#### 0.1", np.float32(0.1), 1.0),  # float32 read in its own shortest repr
    ],
)
def test_gsm8k_compares_numbers_exactly(response: str, truth, expected: float) -> None:
    assert gsm8k.compute_score(response, truth) == expected


def test_arithmetic_integers_above_2_to_53() -> None:
    big = 2**60 + 1
    assert arith.compute_score(str(big), big) == 1.0 and arith.compute_score(str(big), str(big)) == 1.0
    assert arith.compute_score(str(big - 1), big) == 0.0
    assert default_compute_score("rlforge/arithmetic", f"so it is {big}", big, None) == 1.0
    assert canonical_number(big) == str(big) and canonical_number(f"{big}.000") == str(big)


def test_numeric_exact_helpers() -> None:
    assert not numbers_equal("1000000001", 1000000000) and numbers_equal("1.50", 1.5)
    assert numbers_equal("7", np.int64(7)) and numbers_equal("2.5", np.float16(2.5))
    assert canonical_number("1e-7") == "0.0000001" and canonical_number(np.float32(0.1)) == "0.1"
    assert not numbers_equal(True, 1) and canonical_number(float("nan")) == "nan"


@pytest.mark.parametrize("response,truth,expected", [
    ("#### 1e999999999", "1", 0.0),  # verl's regex reads the mantissa "1": a silent false positive
    ("#### 12e3", "1", 0.0),
    ("#### 1E+3", "1", 0.0),
    ("#### 1000", "1000", 1.0),
    ("#### 1 is the answer", "1", 1.0),
])
def test_gsm8k_strict_number_with_an_exponent_is_no_answer(response: str, truth: str, expected: float) -> None:
    assert gsm8k.compute_score(response, truth) == expected

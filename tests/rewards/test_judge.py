"""The LLM judge (``reward_model.judge.*``): scripted judgments parsed by both parsers with the failure
policy counted; one real generation of ``preset:tiny`` on the native engine through the config; a
template without ``{response}`` is one error naming the key."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import text_prompts

import rlforge.config
from rlforge.errors import ConfigError
from rlforge.rewards import RewardManager
from rlforge.rewards.judge import LLMJudge, ScoreParser, fill_template
from rlforge.rewards.model_reward import build_model_scorer, judge_scorer, reward_metrics, with_model_reward
from rlforge.rollout.base import assemble

SCRIPT = ["The answer is right. Score: 9", "3 of 5 steps are fine; overall 4", "No idea.", "Score: 12 (of 10)",
          "Score: 7.5, not 3"]


def _batch(tok, n: int):
    prompts = text_prompts(tok, [f"What is {i}+1?" for i in range(n)])
    raw = torch.tensor([tok(f"{i + 1}", add_special_tokens=False)["input_ids"][:1] + [tok.eos_token_id]
                        for i in range(n)])
    batch = assemble(prompts, raw, [tok.eos_token_id], tok.pad_token_id)
    batch.non_tensor["data_source"] = np.array(["rlforge/arithmetic"] * n, dtype=object)
    batch.non_tensor["ground_truth"] = np.array([str(i + 1) for i in range(n)], dtype=object)
    return batch


def test_fill_template_replaces_the_three_fields_once() -> None:
    t = 'Q: {prompt}\nA: {response}\nRef: {ground_truth}\nJSON: {"score": n}'
    assert fill_template(t, "2+2", "{prompt} 4", 4) == 'Q: 2+2\nA: {prompt} 4\nRef: 4\nJSON: {"score": n}'


@pytest.mark.parametrize("regex, expected", [
    (None, [9.0, 4.0, None, 10.0, 3.0]),  # the last number in [0, 10]
    (r"Score: ([0-9.]+)", [9.0, None, None, None, 7.5]),  # the last match; 12 is out of range
])
def test_parsers(regex, expected) -> None:
    parser = ScoreParser(regex, 0.0, 10.0)
    assert [parser.parse(s) for s in SCRIPT] == expected


def test_scripted_judgments_and_the_failure_policy(tiny_tokenizer) -> None:
    """Scripted generations (a fake engine) through the judge and the reward wrapper on preset:tiny's tokenizer."""
    seen: list[list[int]] = []

    def scripted(ids: list[list[int]]) -> list[str]:
        seen.extend(ids)
        return SCRIPT[: len(ids)]

    judge = LLMJudge(tiny_tokenizer, scripted, "Question {prompt}\nAnswer {response}\nTruth {ground_truth}",
                     ScoreParser(r"Score: ([0-9.]+)", 0.0, 10.0), failure_score=-1.0)
    from rlforge.rewards.model_reward import ModelScoredRewards

    reward = ModelScoredRewards(RewardManager(tiny_tokenizer), judge_scorer(judge))
    out = reward.score(_batch(tiny_tokenizer, 5))
    assert out.scores.tolist() == [9.0, -1.0, -1.0, -1.0, 7.5]
    m = reward_metrics(reward)
    assert m["reward/judge_parse_failures"] == 3.0 and m["reward/judge_parse_failure_rate"] == pytest.approx(0.6)
    text = tiny_tokenizer.decode(seen[0])
    assert "Question What is 0+1?" in text and "Answer 1" in text and "Truth 1" in text
    assert text.rstrip().endswith("assistant")  # the chat template's generation prompt


def test_real_generation_on_the_native_engine_counts_unparsable_output(tiny_tokenizer) -> None:
    """preset:tiny (random weights) cannot write 'VERDICT=<n>': every judgment fails and gets failure_score."""
    import rlforge.rewards.judge as judge_mod

    engines = []
    real = judge_mod.engine_generate

    def spy(module, *a, **k):
        from rlforge.rollout.native.model_runner import unsupported_reason

        engines.append(unsupported_reason(module) is None)
        return real(module, *a, **k)

    cfg = rlforge.config.load_config([
        "trainer.device=cpu", "reward_model.judge.enable=true", "reward_model.judge.path=preset:tiny",
        "reward_model.judge.score_regex=VERDICT=(\\d+)", "reward_model.judge.failure_score=-2.0",
        "reward_model.judge.response_length=4", "reward_model.combine=sum",
    ])
    rlforge.config.validate_config(cfg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(judge_mod, "engine_generate", spy)
        reward = with_model_reward(RewardManager(tiny_tokenizer), cfg, torch.device("cpu"))
    assert engines == [True]  # Llama: the native engine
    out = reward.score(_batch(tiny_tokenizer, 3))
    judge = reward.scorer.model
    assert len(judge.last_judgments) == 3
    assert all(len(tiny_tokenizer(j, add_special_tokens=False)["input_ids"]) <= 6 for j in judge.last_judgments)
    assert reward_metrics(reward)["reward/judge_parse_failures"] == 3.0
    assert out.scores.tolist() == [1.0 - 2.0] * 3  # combine=sum: the arithmetic rule (all right) + failure_score


@pytest.mark.parametrize("overrides, key", [
    (["reward_model.judge.prompt_template=Rate {prompt}"], "reward_model.judge.prompt_template"),
    (["reward_model.judge.score_regex='Score: [0-9]+'"], "reward_model.judge.score_regex"),
    (["reward_model.judge.score_range=[5,1]"], "reward_model.judge.score_range"),
])
def test_bad_judge_settings_are_one_error_naming_the_key(overrides, key) -> None:
    cfg = rlforge.config.load_config(["reward_model.judge.enable=true", "reward_model.judge.path=preset:tiny",
                                      *overrides])
    with pytest.raises(ConfigError) as info:
        rlforge.config.validate_config(cfg)
    assert key in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_model_scorer(cfg, torch.device("cpu"))


def test_template_without_response_through_the_cli(capsys) -> None:
    from rlforge.cli import main

    rc = main(["train", "reward_model.judge.enable=true", "reward_model.judge.path=preset:tiny",
               "reward_model.judge.prompt_template=Rate {prompt}", "trainer.device=cpu"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "reward_model.judge.prompt_template" in err[0], err


def test_manager_metrics_pass_through_under_sum(tiny_tokenizer) -> None:
    """A manager that reports metrics (``metrics()``) keeps them under combine=sum; override does not call it."""

    class Counting(RewardManager):
        def metrics(self) -> dict[str, float]:
            return {"reward/timeouts": 2.0}

    judge = LLMJudge(tiny_tokenizer, lambda ids: ["Score: 1"] * len(ids), "{response}", ScoreParser(None, 0, 10))
    from rlforge.rewards.model_reward import ModelScoredRewards

    for combine, expected in (("sum", {"reward/timeouts": 2.0}), ("override", {})):
        reward = ModelScoredRewards(Counting(tiny_tokenizer), judge_scorer(judge), combine)
        reward.score(_batch(tiny_tokenizer, 2))
        m = reward_metrics(reward)
        assert {k: v for k, v in m.items() if k == "reward/timeouts"} == expected, (combine, m)
        assert m["reward/judge_parse_failures"] == 0.0

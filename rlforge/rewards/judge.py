"""Generative reward model ("LLM judge"): a causal LM writes a judgment, a parser reads its score.

For each response the judge gets ``reward_model.judge.prompt_template`` with ``{prompt}``,
``{response}`` and ``{ground_truth}`` replaced (optionally inside its chat template), generates up to
``judge.response_length`` tokens on rlforge's native engine (``hf`` for architectures the native runner
does not reproduce), and the score is parsed from the text:

* ``judge.score_regex`` set: the group of the regex's LAST match, as a float;
* else: the last number in the judgment that lies in ``judge.score_range``.

A judgment with no parsable score in ``score_range`` gets ``judge.failure_score`` and is counted in
``reward/judge_parse_failures`` (per step).  verl has no judge keys (it calls a generative RM from a
custom reward function); these are rlforge's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlforge.batch import Batch
from rlforge.errors import ConfigError, RewardError
from rlforge.rewards.decode import decode_masked
from rlforge.rollout.base import SamplingParams

TEMPLATE_KEY = "reward_model.judge.prompt_template"
FIELDS = ("{prompt}", "{response}", "{ground_truth}")
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")


def check_template(template: str, key: str = TEMPLATE_KEY) -> None:
    """Raises ConfigError (naming ``key``) when ``template`` has no ``{response}`` field."""
    if "{response}" not in str(template):
        raise ConfigError(f"{key} has no {{response}} field, so the judge would never see the response; add "
                          "{response} (and optionally {prompt}, {ground_truth}) to the template")


def fill_template(template: str, prompt: str, response: str, ground_truth: Any) -> str:
    """``template`` with the three fields replaced, in one pass (text inside the values is not re-read);
    any other braces are kept."""
    values = {"{prompt}": prompt, "{response}": response,
              "{ground_truth}": "" if ground_truth is None else str(ground_truth)}
    return re.sub("|".join(re.escape(f) for f in FIELDS), lambda m: values[m.group(0)], template)


@dataclass(frozen=True)
class ScoreParser:
    """Reads a score from a judgment.

    Args:
        regex: a pattern with exactly one group (its last match counts), or None for the last number in
            ``[lo, hi]``.
        lo, hi: the valid score range (inclusive).

    Raises:
        ConfigError: the regex does not compile or has not exactly one group, or ``lo >= hi``.
    """

    regex: str | None
    lo: float
    hi: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.lo) and math.isfinite(self.hi) and self.lo < self.hi):
            raise ConfigError(f"reward_model.judge.score_range=[{self.lo}, {self.hi}]: give [lo, hi] with lo < hi")
        if self.regex is not None:
            try:
                groups = re.compile(self.regex).groups
            except re.error as e:
                raise ConfigError(f"reward_model.judge.score_regex={self.regex!r} is not a valid regex: {e}") from None
            if groups != 1:
                raise ConfigError(f"reward_model.judge.score_regex={self.regex!r} has {groups} groups; give exactly "
                                  "one, around the score (e.g. 'Score: ([0-9.]+)')")

    def parse(self, text: str) -> float | None:
        """The score in ``text``, or None when there is none in ``[lo, hi]``."""
        if self.regex is not None:
            found = re.findall(self.regex, text)
            if not found:
                return None
            try:
                value = float(found[-1])
            except ValueError:
                return None
            return value if self.lo <= value <= self.hi else None
        for m in reversed(_NUMBER.findall(text)):
            value = float(m)
            if self.lo <= value <= self.hi:
                return value
        return None


GenerateFn = Callable[[list[list[int]]], list[str]]
"""Judge prompts as token ids -> judgments (text); the engine path or a test's script."""


class LLMJudge:
    """Scores responses with a judge model.

    Args:
        tokenizer: the judge's tokenizer (and chat template).
        generate: judge prompt ids -> judgment texts (:func:`engine_generate` or a script).
        template: ``reward_model.judge.prompt_template``.
        parser: the score parser.
        failure_score: score of an unparsable judgment.
        apply_chat_template: wrap the filled template as one user message in the chat template.
        max_length: the most tokens of one judge prompt; None = no limit.

    Raises:
        ConfigError: the template has no ``{response}``.
    """

    def __init__(self, tokenizer: Any, generate: GenerateFn, template: str, parser: ScoreParser,
                 failure_score: float = 0.0, apply_chat_template: bool = True, max_length: int | None = None) -> None:
        check_template(template)
        self.tokenizer = tokenizer
        self.generate = generate
        self.template = template
        self.parser = parser
        self.failure_score = float(failure_score)
        self.apply_chat_template = apply_chat_template and bool(getattr(tokenizer, "chat_template", None))
        self.max_length = max_length
        self.last_judgments: list[str] = []

    def prompt_ids(self, prompts: Sequence[str], responses: Sequence[str], ground_truths: Sequence[Any]) -> list[list[int]]:
        """Judge prompts as token ids, one per response.

        Raises:
            RewardError: a prompt longer than ``reward_model.max_length`` (never cut).
        """
        out = []
        for i, (p, r, g) in enumerate(zip(prompts, responses, ground_truths, strict=True)):
            text = fill_template(self.template, p, r, g)
            if self.apply_chat_template:
                ids = self.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=True,
                                                         add_generation_prompt=True)
                ids = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
            else:
                ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if self.max_length is not None and len(ids) > self.max_length:
                raise RewardError(f"judge prompt {i} is {len(ids)} tokens, longer than reward_model.max_length="
                                  f"{self.max_length}; raise reward_model.max_length (prompts are never cut)")
            out.append(ids)
        return out

    def score(self, prompts: Sequence[str], responses: Sequence[str],
              ground_truths: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """Scores ``(B,)`` float32 and metrics ``reward/judge_parse_failures`` (count) and
        ``reward/judge_parse_failure_rate`` (fraction) of this call."""
        judgments = self.generate(self.prompt_ids(prompts, responses, ground_truths))
        self.last_judgments = list(judgments)
        parsed = [self.parser.parse(j) for j in judgments]
        failures = sum(v is None for v in parsed)
        scores = torch.tensor([self.failure_score if v is None else v for v in parsed], dtype=torch.float32)
        n = max(len(parsed), 1)
        return scores, {"reward/judge_parse_failures": float(failures), "reward/judge_parse_failure_rate": failures / n}


def left_padded(ids: Sequence[Sequence[int]], pad_id: int) -> Batch:
    """A prompt batch (``input_ids``, ``attention_mask``, ``position_ids``: ``(B, longest)``) for a rollout."""
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, x in enumerate(ids):
        input_ids[i, width - len(x):] = torch.as_tensor(list(x), dtype=torch.long)
        mask[i, width - len(x):] = 1
    return Batch.from_dict({"input_ids": input_ids, "attention_mask": mask,
                            "position_ids": (mask.cumsum(1) - 1).clamp(min=0)})


def engine_generate(module: torch.nn.Module, tokenizer: Any, device: torch.device, dtype: torch.dtype | None,
                    params: SamplingParams, seed: int | None = None) -> GenerateFn:
    """The judge's generation on rlforge's native engine (the hf backend where the native runner does not
    reproduce the architecture).  The weights sit on the CPU between calls (no-op on a CPU run); the
    engine frees its KV cache after each call."""
    from rlforge.rollout.hf import HFRollout
    from rlforge.rollout.native import NativeRollout
    from rlforge.rollout.native.model_runner import unsupported_reason

    eos = [int(tokenizer.eos_token_id)]
    gen_eos = getattr(getattr(module, "generation_config", None), "eos_token_id", None)
    eos += [int(e) for e in (gen_eos if isinstance(gen_eos, list) else [gen_eos]) if e is not None and int(e) not in eos]
    pad = int(tokenizer.pad_token_id)
    device = torch.device(device)
    if unsupported_reason(module) is None:
        rollout: Any = NativeRollout(module, eos, pad, device, autocast_dtype=dtype, progress=False, seed=seed,
                                     pack_weights=False, free_cache_engine=True)
    else:
        rollout = HFRollout(module, eos, pad, device, autocast_dtype=dtype)

    def generate(ids: list[list[int]]) -> list[str]:
        if not ids:
            return []
        module.to(device)
        try:
            out = rollout.generate(left_padded(ids, pad), params)
        finally:
            if device.type != "cpu":
                module.to("cpu")
        return decode_masked(tokenizer, out["responses"], out["response_mask"])

    return generate

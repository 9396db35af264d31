"""Model scores in the reward stage: a reward model or an LLM judge beside the rule scorers.

The trainer's one entry is :func:`with_model_reward`: it wraps the reward manager built from
``reward_model.reward_manager`` so that ``score(batch)`` also gives each response its model score, and
:func:`reward_metrics` (the wrapper's per-call metrics, ``{}`` for a plain manager).  Validation uses the
same wrapped manager.

How the scores meet (``reward_model.combine``):

* ``override`` (verl's behaviour: its reward managers return ``rm_scores`` as they are when the batch has
  them): the model score is the sample's score; the rule / custom function is not called, and
  ``overlong_buffer`` is not applied;
* ``sum``: the rule / custom-function score (with its overlong penalty) plus the model score.

Either way the score sits on the last valid response token (``token_level_scores``, ``(B, R)`` float32).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from rlforge.batch import Batch
from rlforge.rewards.decode import decode_masked
from rlforge.rewards.manager import RewardOutput, last_valid_index

COMBINE = ("override", "sum")


class ModelScorer(Protocol):
    """``scorer(batch, prompts, responses)``; ``scorer.model`` is the reward model or judge."""

    def __call__(self, batch: Batch, prompts: list[Any], responses: list[str]) -> tuple[torch.Tensor, dict[str, float]]:
        """``(B,)`` float32 scores and metrics of one batch."""


def prompt_messages(batch: Batch, tokenizer: Any) -> list[Any]:
    """The policy's prompts: the ``raw_prompt`` messages where the batch has them, else the decoded prompt
    ids (``prompts`` masked by the prompt part of ``attention_mask``, special tokens skipped) as strings."""
    raw = batch.non_tensor.get("raw_prompt")
    if raw is not None:
        return [list(m) if not isinstance(m, str) else m for m in raw]
    prompts = batch["prompts"].cpu()
    mask = batch["attention_mask"][:, : prompts.shape[1]].cpu()
    return decode_masked(tokenizer, prompts, mask)


def prompt_text(prompt: Any) -> str:
    """The judge's ``{prompt}``: the last user message's content (the whole string for a string prompt)."""
    if isinstance(prompt, str):
        return prompt
    users = [str(m.get("content", "")) for m in prompt if m.get("role") == "user"]
    return users[-1] if users else "\n".join(str(m.get("content", "")) for m in prompt)


class ModelScoredRewards:
    """A reward manager whose scores include a model score.

    Args:
        manager: the rule / custom-function reward manager (its ``tokenizer`` decodes the policy's tokens).
        scorer: :func:`rm_scorer` or :func:`judge_scorer`.
        combine: ``override`` | ``sum`` (module docstring).
    """

    def __init__(self, manager: Any, scorer: ModelScorer, combine: str = "override") -> None:
        self.manager = manager
        self.scorer = scorer
        self.combine = combine
        self._metrics: dict[str, float] = {}

    def __getattr__(self, name: str) -> Any:  # the manager's other attributes (tokenizer, decode, ...)
        if name == "manager":
            raise AttributeError(name)
        return getattr(self.manager, name)

    def score(self, batch: Batch) -> RewardOutput:
        """The manager's :class:`RewardOutput` with the model score overriding or added to ``scores``."""
        responses, mask = batch["responses"], batch["response_mask"]
        decoded = self.manager.decode(responses, mask)
        model_scores, metrics = self.scorer(batch, prompt_messages(batch, self.manager.tokenizer), decoded)
        if self.combine == "sum":
            out = self.manager.score(batch)
            scores, extra, extra_text = out.scores + model_scores, out.extra, out.extra_text
        else:
            scores, extra, extra_text = model_scores, {}, {}
        extra = {**extra, "model_score": model_scores.tolist()}
        token_level = torch.zeros(responses.shape, dtype=torch.float32)
        if responses.shape[-1]:
            token_level[torch.arange(len(decoded)), last_valid_index(mask.cpu())] = scores
        own = {**metrics, "reward/model_score/mean": float(model_scores.mean()) if len(decoded) else 0.0}
        # the manager's own metrics of this call (combine=sum), if it reports any
        self._metrics = {**(reward_metrics(self.manager) if self.combine == "sum" else {}), **own}
        return RewardOutput(token_level.to(responses.device), scores, extra, extra_text, decoded)

    def metrics(self) -> dict[str, float]:
        """Metrics of the last :meth:`score` call: ``reward/model_score/mean``, the judge's parse failures, and
        with ``combine=sum`` those the manager reports (its ``metrics()``, if it has one)."""
        return dict(self._metrics)


def reward_metrics(reward: Any) -> dict[str, float]:
    """The reward stage's model-score metrics of the last call; ``{}`` for a manager without a model."""
    fn = getattr(reward, "metrics", None)
    return fn() if callable(fn) else {}


def _policy_ids(batch: Batch) -> list[list[int]]:
    """Each row's valid prompt ids followed by its valid response ids."""
    p = batch["prompts"].cpu()
    pm = batch["attention_mask"][:, : p.shape[1]].cpu()
    r, rm = batch["responses"].cpu(), batch["response_mask"].cpu()
    return [a[am != 0].tolist() + b[bm != 0].tolist() for a, am, b, bm in zip(p, pm, r, rm, strict=True)]


def rm_scorer(rm: Any, retokenize: bool = True) -> ModelScorer:
    """A scorer from a :class:`~rlforge.rewards.reward_model.SequenceRewardModel`: the chat re-rendered with
    the reward model's template (``retokenize``), or the policy's own ids (``input_tokenizer=null``: the
    reward model shares the policy's tokenizer)."""

    def score(batch: Batch, prompts: list[Any], responses: list[str]) -> tuple[torch.Tensor, dict[str, float]]:
        return (rm.score(prompts, responses) if retokenize else rm.score_ids(_policy_ids(batch))), {}

    score.model = rm  # type: ignore[attr-defined]
    return score


def judge_scorer(judge: Any) -> ModelScorer:
    """A scorer from an :class:`~rlforge.rewards.judge.LLMJudge`: ``{ground_truth}`` is the batch's
    ``ground_truth`` field (empty where absent)."""

    def score(batch: Batch, prompts: list[Any], responses: list[str]) -> tuple[torch.Tensor, dict[str, float]]:
        gts: Sequence[Any] = batch.non_tensor.get("ground_truth", [None] * len(responses))
        return judge.score([prompt_text(p) for p in prompts], responses, list(gts))

    score.model = judge  # type: ignore[attr-defined]
    return score


def build_model_scorer(cfg: Any, device: torch.device, seed: int = 0,
                       dtype: torch.dtype | None = None) -> ModelScorer | None:
    """The scorer that ``reward_model.enable`` (reward model) or ``reward_model.judge.enable`` (judge)
    asks for, loaded onto the CPU (it is moved to ``device`` while scoring) in ``dtype`` (the compute
    dtype: bfloat16 on CUDA; None = float32); ``seed`` initialises ``preset:`` weights. None when neither.

    Raises:
        ModelError: a reward model / judge path that cannot be loaded or is not a reward model.
        ConfigError: a bad judge template, regex or range.
    """
    rm_cfg = cfg.reward_model
    if rm_cfg.enable:
        from rlforge.rewards.reward_model import SequenceRewardModel, load_sequence_rm

        model, tok = load_sequence_rm(str(rm_cfg.model.path), trust_remote_code=bool(rm_cfg.model.trust_remote_code))
        micro = rm_cfg.micro_batch_size_per_gpu or rm_cfg.micro_batch_size
        budget = int(rm_cfg.forward_max_token_len_per_gpu) if rm_cfg.use_dynamic_bsz else None
        rm = SequenceRewardModel(model, tok, device, dtype or torch.float32, micro, budget, rm_cfg.max_length)
        return rm_scorer(rm, retokenize=rm_cfg.model.input_tokenizer is not None)
    j = rm_cfg.judge
    if j.enable:
        from rlforge.models import load_causal_lm, load_tokenizer
        from rlforge.rewards.judge import LLMJudge, ScoreParser, check_template, engine_generate
        from rlforge.rollout.base import SamplingParams

        check_template(j.prompt_template)
        lo, hi = (float(x) for x in j.score_range)
        parser = ScoreParser(j.score_regex, lo, hi)
        key = "reward_model.judge.path"
        tok = load_tokenizer(str(j.path), j.tokenizer_path, key=key)
        module = load_causal_lm(str(j.path), tok, seed=seed, key=key).eval().requires_grad_(False)
        if dtype is not None:
            module.to(dtype=dtype)
        params = SamplingParams(temperature=float(j.temperature), do_sample=float(j.temperature) > 0,
                                max_new_tokens=int(j.response_length))
        generate = engine_generate(module, tok, device, dtype, params, seed=seed)
        return judge_scorer(LLMJudge(tok, generate, j.prompt_template, parser, float(j.failure_score),
                                     bool(j.apply_chat_template), rm_cfg.max_length))
    return None


def with_model_reward(manager: Any, cfg: Any, device: torch.device, seed: int = 0,
                      dtype: torch.dtype | None = None) -> Any:
    """``manager`` wrapped in :class:`ModelScoredRewards` when a reward model or judge is enabled, else
    ``manager`` itself (arguments as :func:`build_model_scorer`).  The trainer's only entry point to model
    scores."""
    scorer = build_model_scorer(cfg, device, seed, dtype)
    return manager if scorer is None else ModelScoredRewards(manager, scorer, str(cfg.reward_model.combine))

"""Discriminative reward model: a sequence-classification model scores prompt + response.

Source: verl's ``RewardModelWorker`` (``verl/workers/fsdp_workers.py``): the policy's tokens are
decoded to text, the chat (``raw_prompt`` + the response as an assistant turn) is rendered with the
reward model's own chat template and tokenizer (``_switch_chat_template``), and the score is the
one-label head's output at the last valid (non-pad) token.  Deviations from verl:

* no truncation: an input longer than ``reward_model.max_length`` is a :class:`~rlforge.errors.RewardError`
  naming the key, the sample and its length (verl cuts it silently);
* the model is a plain module on each process (no FSDP); while it is not scoring its weights sit in
  host memory (``sleep``) and are moved to the device only for :meth:`SequenceRewardModel.score_ids`
  (on a CPU run both are no-ops);
* ``use_dynamic_bsz`` groups rows sorted by length so that rows x longest row (padding included)
  stays within ``forward_max_token_len_per_gpu``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer, PreTrainedModel

from rlforge.errors import ModelError, RewardError
from rlforge.models.loader import _as_model_error, _hf_folder, load_tokenizer, resolve_source
from rlforge.models.presets import preset_config

KEY = "reward_model.model.path"


def load_sequence_rm(path: str, key: str = KEY, trust_remote_code: bool = False) -> tuple[PreTrainedModel, Any]:
    """Load a reward model and its tokenizer from a local folder or Hub id ``org/name`` (or
    ``preset:NAME``: random weights, the default model's tokenizer; for benchmarks).

    Returns:
        ``(model, tokenizer)``; the model is float32 on the CPU in eval mode, with one label.

    Raises:
        ModelError: naming ``key`` and the folder, when the folder has no sequence-classification head
            (e.g. a causal-LM folder), has more than one label, or its tokenizer has ids beyond the
            model's embedding table (a vocabulary that does not match).
    """
    src = resolve_source(path, key)
    if src.kind == "preset":
        tok = load_tokenizer(path, key=key)
        cfg = preset_config(src.location, len(tok))
        cfg.num_labels = 1
        model = AutoModelForSequenceClassification.from_config(cfg, dtype=torch.float32)
    else:
        folder = _hf_folder(src)
        with _as_model_error(key, path, "read a reward model config from"):
            cfg = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        archs = list(getattr(cfg, "architectures", None) or [])
        if archs and not any(a.endswith("ForSequenceClassification") for a in archs):
            raise ModelError(
                f"{key}={path}: not a reward model: its config.json names {', '.join(archs)}, not a "
                "*ForSequenceClassification head. Give a folder saved from "
                "AutoModelForSequenceClassification(num_labels=1)")
        if int(getattr(cfg, "num_labels", 1)) != 1:
            raise ModelError(f"{key}={path}: the classification head has {cfg.num_labels} labels; a reward model "
                             "has one (num_labels=1)")
        with _as_model_error(key, path, "load a reward model from"):
            model, info = AutoModelForSequenceClassification.from_pretrained(
                folder, dtype=torch.float32, output_loading_info=True, trust_remote_code=trust_remote_code)
            tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust_remote_code)
        head = _head_name(model)
        if any(k.split(".")[0] == head for k in info.get("missing_keys", [])):
            raise ModelError(f"{key}={path}: the folder holds no weights for the classification head "
                             f"'{head}' (a causal-LM or base-model checkpoint?); a reward model needs a trained head")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    rows = model.get_input_embeddings().num_embeddings
    if len(tok) > rows:
        raise ModelError(f"{key}={path}: the tokenizer has {len(tok)} tokens but the model's embedding table "
                         f"{rows} rows: the vocabulary does not match its tokenizer")
    model.config.pad_token_id = tok.pad_token_id
    _head_name(model, path, key)
    return model.eval().requires_grad_(False), tok


def _head_name(model: torch.nn.Module, path: str | None = None, key: str = KEY) -> str:
    for name in ("score", "classifier"):
        if isinstance(getattr(model, name, None), torch.nn.Module):
            return name
    if path is not None:
        raise ModelError(f"{key}={path}: {type(model).__name__} has no 'score' or 'classifier' head")
    return "score"


class SequenceRewardModel:
    """Scores token sequences with a one-label sequence-classification model.

    Args:
        model: from :func:`load_sequence_rm`.
        tokenizer: the reward model's tokenizer (and chat template).
        device: where it scores; between calls the weights sit on the CPU.
        dtype: compute dtype (bfloat16 on CUDA; float32 on CPU).
        micro_batch_size: rows per forward; None = all rows at once.
        max_token_len: with dynamic batching, the most rows x padded length per forward (tokens); None = off.
        max_length: the most tokens of one input; None = no limit.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: Any, device: torch.device, dtype: torch.dtype = torch.float32,
                 micro_batch_size: int | None = None, max_token_len: int | None = None,
                 max_length: int | None = None) -> None:
        self.model = model.to(dtype=dtype)
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.micro_batch_size = micro_batch_size
        self.max_token_len = max_token_len
        self.max_length = max_length
        self.head = getattr(model, _head_name(model))
        self.backbone = model.base_model
        self.sleep()

    def sleep(self) -> None:
        """Weights to host memory (a no-op on CPU)."""
        if self.device.type != "cpu":
            self.model.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()

    def wake(self) -> None:
        """Weights to ``device`` (a no-op on CPU)."""
        if self.device.type != "cpu":
            self.model.to(self.device)

    def render(self, prompts: Sequence[Any], responses: Sequence[str]) -> list[list[int]]:
        """Token ids of each chat: ``prompts[i]`` (a list of ``{"role", "content"}`` messages, or a string:
        one user message) followed by ``responses[i]`` as the assistant turn, rendered with the reward
        model's chat template (plain ``prompt + response`` text when it has none) and tokenized with its
        tokenizer (no special tokens added beyond the template's)."""
        tok, out = self.tokenizer, []
        for p, r in zip(prompts, responses, strict=True):
            msgs = [{"role": "user", "content": p}] if isinstance(p, str) else [dict(m) for m in p]
            if getattr(tok, "chat_template", None):
                text = tok.apply_chat_template([*msgs, {"role": "assistant", "content": r}], tokenize=False)
            else:
                text = "\n".join(str(m.get("content", "")) for m in msgs) + r
            out.append(tok(text, add_special_tokens=False)["input_ids"])
        return out

    def micro_batches(self, lengths: Sequence[int]) -> list[list[int]]:
        """Row indices of each forward: fixed ``micro_batch_size`` rows in order, or (``max_token_len``)
        rows sorted by length, longest first, grouped while rows x longest <= ``max_token_len``."""
        n = len(lengths)
        if self.max_token_len is None:
            size = self.micro_batch_size or max(n, 1)
            return [list(range(i, min(i + size, n))) for i in range(0, n, size)]
        order = sorted(range(n), key=lambda i: (-lengths[i], i))
        groups: list[list[int]] = []
        for i in order:
            if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= self.max_token_len:
                groups[-1].append(i)
            else:
                groups.append([i])
        return groups

    @torch.no_grad()
    def score_ids(self, ids: Sequence[Sequence[int]], what: str = "reward model input") -> torch.Tensor:
        """Scores of token sequences: shape ``(len(ids),)`` float32 on the CPU, each the head's output at the
        sequence's last token (rows are right-padded; the pad positions are masked out).

        Raises:
            RewardError: an empty sequence, or one longer than ``reward_model.max_length``.
        """
        lengths = [len(x) for x in ids]
        for i, n in enumerate(lengths):
            if n == 0:
                raise RewardError(f"{what} {i} has no tokens")
            if self.max_length is not None and n > self.max_length:
                raise RewardError(f"{what} {i} is {n} tokens, longer than reward_model.max_length={self.max_length}; "
                                  "raise reward_model.max_length (inputs are never cut)")
        scores = torch.zeros(len(ids), dtype=torch.float32)
        self.wake()
        try:
            for rows in self.micro_batches(lengths):
                width = max(lengths[i] for i in rows)
                input_ids = torch.full((len(rows), width), int(self.tokenizer.pad_token_id), dtype=torch.long)
                mask = torch.zeros_like(input_ids)
                for j, i in enumerate(rows):
                    input_ids[j, : lengths[i]] = torch.as_tensor(list(ids[i]), dtype=torch.long)
                    mask[j, : lengths[i]] = 1
                input_ids, mask = input_ids.to(self.device), mask.to(self.device)
                hidden = self.backbone(input_ids=input_ids, attention_mask=mask).last_hidden_state  # (b, L, H)
                last = hidden[torch.arange(len(rows), device=self.device), mask.sum(-1) - 1]  # (b, H)
                scores[rows] = self.head(last)[:, 0].float().cpu()
        finally:
            self.sleep()
        return scores

    def score(self, prompts: Sequence[Any], responses: Sequence[str]) -> torch.Tensor:
        """Scores ``(B,)`` float32 (the model's units) of each prompt + response (see :meth:`render`)."""
        return self.score_ids(self.render(prompts, responses))

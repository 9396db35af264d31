"""``rollout.name=hf``: generation with transformers' ``generate`` on the actor's own module.

The rollout holds a reference to the actor's ``nn.Module``, so every step samples from
the current weights with nothing to copy.  It is the reference backend: simple and
exact, not fast (``rollout.name=native``, rlforge's own engine, is the fast one).
"""

from __future__ import annotations

import torch
from tqdm import tqdm
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, PreTrainedModel

from rlforge.batch import Batch
from rlforge.errors import RLForgeError
from rlforge.progress import progress_bar
from rlforge.rollout.base import ROLLOUTS, Rollout, SamplingParams, assemble


class _ProgressTicker(LogitsProcessor):
    """Advances a progress bar once per generated token (it does not change the scores)."""

    def __init__(self, bar: tqdm) -> None:
        self.bar = bar

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        self.bar.update(1)
        return scores


@ROLLOUTS.register("hf")
class HFRollout(Rollout):
    """transformers ``generate``; ``micro_batch_size`` rows per call (None = all at once).

    Args:
        module: the actor's causal LM (shared, not copied).
        eos_ids: token ids that end a response.
        pad_id: the tokenizer's pad id.
        device: where the module lives.
        autocast_dtype: dtype for ``torch.autocast`` on CUDA (None = off).
        progress: show a per-token progress bar (on a terminal only).
    """

    def __init__(
        self,
        module: PreTrainedModel,
        eos_ids: list[int],
        pad_id: int,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
        micro_batch_size: int | None = None,
        progress: bool = True,
    ) -> None:
        self.module = module
        self.eos_ids = eos_ids
        self.pad_id = pad_id
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.micro_batch_size = micro_batch_size
        self.progress = progress

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        kw: dict = dict(
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            use_cache=True,
        )
        if params.greedy:
            kw.update(do_sample=False)
        else:
            kw.update(
                do_sample=True,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=params.top_k if params.top_k > 0 else 0,
            )
        return GenerationConfig(**kw)

    @torch.no_grad()
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        was_training = self.module.training
        self.module.eval()
        gen_cfg = self._generation_config(params)
        chunk = self.micro_batch_size or len(prompts)
        outs: list[torch.Tensor] = []
        chunks = prompts.split(chunk)
        bar = progress_bar(
            total=params.max_new_tokens * len(chunks), desc="gen", unit="tok", leave=False,
            disable=not self.progress,
        )
        try:
            for part in chunks:
                ids = part["input_ids"].to(self.device)
                mask = part["attention_mask"].to(self.device)
                with torch.autocast(
                    self.device.type, dtype=self.autocast_dtype or torch.float32,
                    enabled=self.autocast_dtype is not None,
                ):
                    try:
                        seq = self.module.generate(
                            input_ids=ids, attention_mask=mask, generation_config=gen_cfg,
                            logits_processor=LogitsProcessorList([_ProgressTicker(bar)]),
                        )
                    except RuntimeError as e:
                        if "probability tensor" not in str(e):
                            raise
                        raise RLForgeError(
                            "the policy produced non-finite probabilities: its weights diverged. Lower "
                            "actor_rollout_ref.actor.optim.lr or grad_clip, or check the reward scale"
                        ) from None
                resp = seq[:, ids.shape[1]:].cpu()
                outs.append(resp)
        finally:
            bar.close()
            self.module.train(was_training)
        width = max(r.shape[1] for r in outs)
        padded = [
            torch.nn.functional.pad(r, (0, width - r.shape[1]), value=self.pad_id) for r in outs
        ]
        return assemble(prompts, torch.cat(padded, 0), self.eos_ids, self.pad_id)

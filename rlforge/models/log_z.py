"""The learnable log-partition head log Z(x) of FlowRL.

Source: Zhu et al. 2025, "FlowRL: Matching Reward Distributions for LLM Reasoning", §3
(log Z is "a small MLP on the mean of the last-layer hidden states of the prompt").

:class:`PolicyWithLogZ` owns the causal LM and the head side by side.  The rollout
generates with ``.lm`` alone, so the head never enters the rollout weights; the engine
trains both (the head with its own learning-rate multiplier); ``state_dict`` keeps both
for resuming.
"""

from __future__ import annotations

import torch
from torch import nn


class LogZHead(nn.Module):
    """MLP ``hidden_size -> width -> width -> 1`` (GELU), float32.

    Input ``(batch, hidden_size)`` of any float dtype (bf16 hidden states under mixed
    precision); output ``(batch,)`` float32 log Z in nats.  The last layer starts at zero so
    log Z(x) = 0 at initialisation.

    The head stays float32 under mixed precision: :attr:`keep_fp32` asks the engines to keep
    its parameters and its compute in float32 (FSDP2 gives it its own unit with a float32
    policy; the forward turns autocast off and casts the input to the weights' dtype).  A
    bf16 log Z would round a value of 20 nats to 0.125, the size of the reward terms it must
    balance.
    """

    keep_fp32 = True
    """Engines keep this module's parameters and compute in float32 whatever the mixed precision."""

    def __init__(self, hidden_size: int, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(hidden_size, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1)
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        # a new tensor, not a view of the [batch, 1] output: FSDP2 hooks its pre-backward on the
        # root's outputs, and an in-place op on a returned view would drop that hook
        with torch.autocast(pooled.device.type, enabled=False):
            out = self.net(pooled.to(self.net[0].weight.dtype))
        return out.float().squeeze(-1).clone()


class PolicyWithLogZ(nn.Module):
    """A causal LM plus a :class:`LogZHead`.

    Calling the module runs the LM alone (same signature and outputs as the LM), so
    forward-only passes (``old_log_prob``) need nothing special.  :meth:`forward_with_log_z`
    also returns log Z from the mean last-layer hidden state over the prompt tokens;
    :meth:`hidden_with_log_z` returns that hidden state instead of the logits.
    """

    def __init__(self, lm: nn.Module, width: int) -> None:
        super().__init__()
        self.lm = lm
        self.log_z_head = LogZHead(int(lm.config.hidden_size), width)

    def forward(self, *args, **kwargs):  # noqa: ANN002, ANN003 - the LM's own signature
        return self.lm(*args, **kwargs)

    def forward_with_log_z(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, prompt_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits ``(batch, seq, vocab)`` and log Z ``(batch,)`` for left-padded prompts of
        width ``prompt_len`` followed by responses."""
        out = self.lm(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            use_cache=False, output_hidden_states=True,
        )
        return out.logits, self._log_z(out.hidden_states[-1], attention_mask, prompt_len)

    def hidden_with_log_z(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, prompt_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As :meth:`forward_with_log_z` without the LM head: the last (final-norm) hidden
        states ``(batch, seq, hidden_size)`` instead of the logits (``logits_to_keep`` selects
        no position), for the chunked head of :mod:`rlforge.roles.fused_head`."""
        out = self.lm(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
            use_cache=False, output_hidden_states=True,
            logits_to_keep=torch.empty(0, dtype=torch.long, device=input_ids.device),
        )
        hidden = out.hidden_states[-1]
        return hidden, self._log_z(hidden, attention_mask, prompt_len)

    def _log_z(self, hidden: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """log Z ``(batch,)`` from the mean last hidden state over the (valid) prompt tokens."""
        prompt = hidden[:, :prompt_len].float()
        mask = attention_mask[:, :prompt_len].unsqueeze(-1).float()
        pooled = (prompt * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.log_z_head(pooled)

    def lm_and_head_parameters(self) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """The LM's and the head's trainable parameters (for separate learning rates)."""
        lm = [p for p in self.lm.parameters() if p.requires_grad]
        head = [p for p in self.log_z_head.parameters() if p.requires_grad]
        return lm, head

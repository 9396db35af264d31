"""Forward passes shared by the actor, reference and critic.

All take a micro-batch with ``input_ids``, ``attention_mask``, ``position_ids``
``(batch, prompt_len + response_len)`` and ``responses`` ``(batch, response_len)``; the
logits at position ``t`` predict token ``t + 1``, so the response is scored by positions
``prompt_len - 1 ... prompt_len + response_len - 2``.

The log-prob functions take ``chunk_size``: 0 runs the model's head over every position
(the plain path); ``> 0`` runs the model without its head and computes the response
positions' log-probs ``chunk_size`` at a time (:mod:`rlforge.roles.fused_head`; responses'
padding positions then hold 0, as in the padding-free forward).
"""

from __future__ import annotations

import torch

from rlforge.algorithms.entropy import entropy_from_logits
from rlforge.algorithms.log_probs import log_probs_from_logits, sum_pi_squared_from_logits
from rlforge.batch import Batch
from rlforge.engine.packing import plan_or_make
from rlforge.models.log_z import PolicyWithLogZ
from rlforge.roles.fused_head import (
    fsdp2_view_outputs_ok,
    head_log_probs,
    last_hidden_states,
    scatter_flat,
)


def _response_slice(mb: Batch) -> slice:
    resp_len = mb["responses"].shape[1]
    total = mb["input_ids"].shape[1]
    return slice(total - resp_len - 1, total - 1)


def _response_log_probs_from_logits(
    logits: torch.Tensor, mb: Batch, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = logits[:, _response_slice(mb)].float()
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp = log_probs_from_logits(logits, mb["responses"])
    ent = entropy_from_logits(logits) if with_entropy else None
    return logp, ent


def _response_log_probs_from_hidden(
    module: torch.nn.Module, hidden: torch.Tensor, mb: Batch, temperature: float, with_entropy: bool,
    chunk_size: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The chunked head on the response positions of ``hidden (batch, seq, hidden_size)``;
    0 where the response token is padding."""
    cols = _response_slice(mb)
    plan = plan_or_make(mb)  # the host's plan, or one made now (a device read per index op)
    assert plan.keep_flat is not None  # mb has responses
    h = hidden[:, cols].reshape(-1, hidden.shape[-1]).index_select(0, plan.keep_flat)
    targets = mb["responses"].reshape(-1).index_select(0, plan.keep_flat)
    logp, ent = head_log_probs(module, h, targets, temperature, with_entropy, chunk_size)
    shape = mb["responses"].shape
    return (scatter_flat(plan.keep_flat, logp, shape),
            scatter_flat(plan.keep_flat, ent, shape) if ent is not None else None)


def response_log_probs(
    module: torch.nn.Module, mb: Batch, temperature: float, with_entropy: bool, chunk_size: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs ``(batch, response_len)`` float32 nats of the response tokens under
    ``softmax(logits / temperature)``, and optionally the entropy of that distribution.

    Dividing by the rollout temperature makes these the log-probs of the distribution
    the rollout sampled from (verl does the same).  ``chunk_size``: see the module docstring.
    """
    if chunk_size > 0:
        hidden = last_hidden_states(module, mb["input_ids"], mb["attention_mask"], mb["position_ids"])
        return _response_log_probs_from_hidden(module, hidden, mb, temperature, with_entropy, chunk_size)
    out = module(
        input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"],
        use_cache=False,
    )
    return _response_log_probs_from_logits(out.logits, mb, temperature, with_entropy)


def response_log_probs_and_sum_pi_squared(
    module: torch.nn.Module, mb: Batch, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """As :func:`response_log_probs` on the padded path (full logits), plus ``sum_v pi_v^2``
    ``(batch, response_len)`` float32 of ``softmax(logits / temperature)`` at each response position
    (``actor.calculate_sum_pi_squared``; 0 where the response is padding)."""
    out = module(
        input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"],
        use_cache=False,
    )
    logits = out.logits[:, _response_slice(mb)]
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp, ent = _response_log_probs_from_logits(out.logits, mb, temperature, with_entropy)
    keep = mb["response_mask"] != 0 if "response_mask" in mb else torch.ones_like(logp, dtype=torch.bool)
    spp = torch.where(keep, sum_pi_squared_from_logits(logits), torch.zeros((), device=logp.device))
    return logp, ent, spp


def response_log_probs_with_log_z(
    module: PolicyWithLogZ, mb: Batch, temperature: float, with_entropy: bool, chunk_size: int = 0
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """As :func:`response_log_probs`, plus the log Z(x) ``(batch,)`` of the module's head (a policy loss's hook)."""
    if chunk_size > 0:
        hidden, log_z = module.hidden_with_log_z(
            mb["input_ids"], mb["attention_mask"], mb["position_ids"], prompt_len=mb["prompts"].shape[1]
        )
        logp, ent = _response_log_probs_from_hidden(module, hidden, mb, temperature, with_entropy, chunk_size)
        return logp, ent, log_z
    logits, log_z = module.forward_with_log_z(
        mb["input_ids"], mb["attention_mask"], mb["position_ids"], prompt_len=mb["prompts"].shape[1]
    )
    logp, ent = _response_log_probs_from_logits(logits, mb, temperature, with_entropy)
    return logp, ent, log_z


def response_values(module: torch.nn.Module, mb: Batch) -> torch.Tensor:
    """Critic values ``(batch, response_len)`` float32: the value head's output at the
    positions that predict each response token (the state before the token)."""
    with fsdp2_view_outputs_ok():
        out = module(
            input_ids=mb["input_ids"], attention_mask=mb["attention_mask"], position_ids=mb["position_ids"],
            use_cache=False,
        )
    return out.logits[:, _response_slice(mb), 0].float()

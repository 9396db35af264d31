"""The critic role: a value model trained with the clipped value loss (PPO, verl)."""

from __future__ import annotations

from typing import Any

import torch

from rlforge.algorithms import compute_value_loss, masked_mean
from rlforge.batch import Batch
from rlforge.engine import LossScale, TrainEngine
from rlforge.engine.packing import packed_response_values
from rlforge.roles.common import MicroBudget, run_updates, split_meta
from rlforge.roles.forward import response_values


class Critic:
    """Args:
        engine: the critic's engine.
        cfg: ``critic`` config (``cliprange_value``, ``loss_agg_mode``, ``ppo_epochs``).
        mini_batch_size, micro_batch_size, forward_micro_batch_size: in sequences.
        max_token_len, forward_max_token_len: token budgets (dynamic batching) or None.
        remove_padding: padding-free forwards (``critic.model.use_remove_padding``).
    """

    def __init__(
        self, engine: TrainEngine, cfg: Any, mini_batch_size: int, micro_batch_size: int,
        forward_micro_batch_size: int, max_token_len: int | None = None,
        forward_max_token_len: int | None = None, remove_padding: bool = False,
    ) -> None:
        self.budget = MicroBudget(micro_batch_size, max_token_len)
        """The update's micro-batching (online back-off may lower it: :mod:`rlforge.trainer.backoff`)."""
        self.forward_budget = MicroBudget(forward_micro_batch_size, forward_max_token_len)
        """The values forward's micro-batching."""
        self.values_fn = packed_response_values if remove_padding else response_values
        self.engine = engine
        self.cfg = cfg
        self.mini_batch_size = mini_batch_size

    def compute_values(self, batch: Batch) -> torch.Tensor:
        """``(batch, response_len)`` float32 values, zero outside ``response_mask``."""

        def fwd(module: torch.nn.Module, mb: Batch) -> dict[str, torch.Tensor]:
            return {"values": self.values_fn(module, mb) * mb["response_mask"]}

        return self.forward_budget.run(batch, lambda mbs, mtl: self.engine.infer(batch, fwd, mbs, mtl))["values"]

    def update(self, batch: Batch) -> dict[str, float]:
        """Value-loss update; returns ``critic/*`` metrics (without the prefix)."""
        cfg = self.cfg
        keys = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "values", "returns"]
        data = Batch(batch.tensors.select(*keys), {}, split_meta(batch))

        def loss_fn(module: torch.nn.Module, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, dict[str, Any]]:
            vpreds = self.values_fn(module, mb)
            mask = mb["response_mask"].float()
            vf_loss, vf_clipfrac = compute_value_loss(
                vpreds, mb["returns"], mb["values"], mask, cfg.cliprange_value, cfg.loss_agg_mode,
                global_num_tokens=scale.global_num_tokens, global_num_seqs=scale.global_num_seqs,
                dp_size=scale.dp_size,
            )
            return vf_loss, {
                "vf_loss": vf_loss.detach(),  # device tensors: read back once per step by the engine
                "vf_clipfrac": vf_clipfrac.detach() if isinstance(vf_clipfrac, torch.Tensor) else vf_clipfrac,
                "vpred_mean": masked_mean(vpreds.detach(), mask),
            }

        return run_updates(
            self.engine, data, loss_fn, self.mini_batch_size, self.budget, cfg.ppo_epochs, "update_critic",
        ).metrics

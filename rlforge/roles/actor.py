"""The actor (policy) and reference roles.

``Actor.update`` runs ``ppo_epochs`` passes over mini-batches of
``ppo_mini_batch_size * rollout.n`` sequences; each mini-batch is one optimizer step,
accumulated over micro-batches of ``ppo_micro_batch_size_per_gpu`` sequences.  The loss
of one micro-batch is

    policy_loss(loss_mode) - entropy_coeff * entropy + kl_loss_coef * kl(π, π_ref)   (kl only with use_kl_loss)

each term aggregated with ``loss_agg_mode`` against the mini-batch totals, so the summed
micro-batch losses equal the mini-batch loss for any split.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from rlforge.algorithms import POLICY_LOSSES, PolicyLossInputs, agg_loss, kl_penalty
from rlforge.batch import Batch
from rlforge.engine import LossScale, TrainEngine
from rlforge.engine.packing import packed_response_log_probs
from rlforge.roles.common import run_updates
from rlforge.roles.forward import response_log_probs, response_log_probs_with_log_z


class LogProbModel:
    """Forward-only log-probs (the reference policy, or the actor's ``old_log_prob``).

    Args:
        engine: the model's engine.
        micro_batch_size: rows per forward.
        max_token_len: token budget per forward (dynamic batching), or None for fixed rows.
        remove_padding: padding-free forward over packed sequences (``model.use_remove_padding``).
        head_chunk_size: positions per chunk of the chunked LM-head log-probs
            (:mod:`rlforge.roles.fused_head`; ``model.fused_kernel_options.chunk_size`` when
            ``use_fused_kernels``); 0 = the model's full logits.
    """

    def __init__(
        self, engine: TrainEngine, micro_batch_size: int, max_token_len: int | None = None,
        remove_padding: bool = False, head_chunk_size: int = 0,
    ) -> None:
        self.engine = engine
        self.micro_batch_size = micro_batch_size
        self.max_token_len = max_token_len
        self.head_chunk_size = int(head_chunk_size)
        fn = packed_response_log_probs if remove_padding else response_log_probs
        self.log_probs_fn = functools.partial(fn, chunk_size=self.head_chunk_size)

    def compute_log_prob(self, batch: Batch, temperature: float, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """``{"log_probs": (batch, response_len)}`` and, if asked, ``"entropys"``, float32 on CPU."""

        def fwd(module: torch.nn.Module, mb: Batch) -> dict[str, torch.Tensor]:
            logp, ent = self.log_probs_fn(module, mb, temperature, with_entropy)
            return {"log_probs": logp, **({"entropys": ent} if ent is not None else {})}

        return self.engine.infer(batch, fwd, self.micro_batch_size, self.max_token_len)


class Actor(LogProbModel):
    """The trained policy.

    Args:
        engine: the actor's training engine.
        cfg: ``actor_rollout_ref.actor`` config.
        mini_batch_size: sequences per optimizer step (``ppo_mini_batch_size * rollout.n``).
        micro_batch_size: sequences per forward/backward.
        log_prob_micro_batch_size: sequences per forward in :meth:`compute_log_prob`.
        with_log_z: the engine's module is a :class:`~rlforge.models.log_z.PolicyWithLogZ` whose
            log Z(x) the policy loss needs (FlowRL; its forward is always the padded one).
        max_token_len, log_prob_max_token_len: token budgets (dynamic batching) for the update
            and for :meth:`compute_log_prob`; None = fixed micro-batch sizes.
        remove_padding: padding-free forwards (``model.use_remove_padding``).
        head_chunk_size: see :class:`LogProbModel` (also used by the FlowRL forward).
    """

    def __init__(
        self, engine: TrainEngine, cfg: Any, mini_batch_size: int, micro_batch_size: int,
        log_prob_micro_batch_size: int, with_log_z: bool = False, max_token_len: int | None = None,
        log_prob_max_token_len: int | None = None, remove_padding: bool = False, head_chunk_size: int = 0,
    ) -> None:
        super().__init__(engine, log_prob_micro_batch_size, log_prob_max_token_len, remove_padding, head_chunk_size)
        self.with_log_z = with_log_z
        self.train_max_token_len = max_token_len
        self.cfg = cfg
        self.mini_batch_size = mini_batch_size
        self.train_micro_batch_size = micro_batch_size
        self.policy_loss = POLICY_LOSSES.get(cfg.policy_loss.loss_mode)

    def _loss_fn(self, temperature: float):
        cfg = self.cfg

        def loss_fn(module: torch.nn.Module, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, dict[str, float]]:
            need_entropy = cfg.entropy_coeff != 0
            log_z = None
            if self.with_log_z:
                logp, ent, log_z = response_log_probs_with_log_z(module, mb, temperature, need_entropy,
                                                                 self.head_chunk_size)
            else:
                logp, ent = self.log_probs_fn(module, mb, temperature, need_entropy)
            mask = mb["response_mask"].float()
            glob = dict(global_num_tokens=scale.global_num_tokens, global_num_seqs=scale.global_num_seqs)
            out = self.policy_loss(
                PolicyLossInputs(
                    old_log_prob=mb["old_log_probs"], log_prob=logp, advantages=mb["advantages"],
                    response_mask=mask, loss_agg_mode=cfg.loss_agg_mode, **glob,
                    ref_log_prob=mb["ref_log_prob"] if "ref_log_prob" in mb else None,
                    token_level_rewards=mb["token_level_rewards"] if "token_level_rewards" in mb else None,
                    index=mb.non_tensor.get("uid"),
                    log_z=log_z,
                ),
                cfg,
            )
            loss = out.loss
            metrics = {"pg_loss": float(out.loss.detach()), **{k: float(v) for k, v in out.metrics.items()}}
            if ent is not None:
                ent_loss = agg_loss(ent, mask, cfg.loss_agg_mode, **glob)
                loss = loss - cfg.entropy_coeff * ent_loss
            if cfg.use_kl_loss:
                kl = kl_penalty(logp, mb["ref_log_prob"], cfg.kl_loss_type)
                kl_term = agg_loss(kl, mask, cfg.loss_agg_mode, **glob)
                loss = loss + cfg.kl_loss_coef * kl_term
                metrics["kl_loss"] = float(kl_term.detach())
                metrics["kl_coef"] = float(cfg.kl_loss_coef)
            return loss, metrics

        return loss_fn

    def update(self, batch: Batch, temperature: float) -> dict[str, float]:
        """PPO update over ``batch``; returns ``actor/*`` metrics (without the prefix)."""
        keys = ["prompts", "input_ids", "attention_mask", "position_ids", "responses", "response_mask",
                "old_log_probs", "advantages"]
        keys += [k for k in ("ref_log_prob", "token_level_rewards") if k in batch]
        uid = {"uid": batch.non_tensor["uid"]} if "uid" in batch.non_tensor else {}
        data = Batch(batch.tensors.select(*keys), uid, {})
        return run_updates(
            self.engine, data, self._loss_fn(temperature), self.mini_batch_size, self.train_micro_batch_size,
            self.cfg.ppo_epochs, "update_actor", self.train_max_token_len,
        )

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

from rlforge.algorithms import (
    POLICY_LOSSES,
    PolicyLossInputs,
    PolicyLossOutput,
    agg_loss,
    kl_loss,
    loss_hooks,
)
from rlforge.algorithms.rollout_correction import compute_rollout_correction, reinforce_loss_matrix
from rlforge.algorithms.utils import masked_mean
from rlforge.batch import Batch
from rlforge.engine import LossScale, TrainEngine
from rlforge.engine.packing import packed_response_log_probs
from rlforge.roles.common import MicroBudget, UpdateResult, run_updates, split_meta
from rlforge.roles.forward import response_log_probs, response_log_probs_and_sum_pi_squared


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
        self.budget = MicroBudget(micro_batch_size, max_token_len)
        """This forward's micro-batching (online back-off may lower it: :mod:`rlforge.trainer.backoff`)."""
        self.head_chunk_size = int(head_chunk_size)
        fn = packed_response_log_probs if remove_padding else response_log_probs
        self.log_probs_fn = functools.partial(fn, chunk_size=self.head_chunk_size)

    def compute_log_prob(self, batch: Batch, temperature: float, with_entropy: bool = False,
                         with_sum_pi_squared: bool = False) -> dict[str, torch.Tensor]:
        """``{"log_probs": (batch, response_len)}`` and, if asked, ``"entropys"`` and
        ``"sum_pi_squared"`` (``sum_v pi_v^2`` per token), float32 on CPU.

        ``with_sum_pi_squared`` (``actor.calculate_sum_pi_squared``) needs the whole vocabulary's
        probabilities, so that forward takes the padded path with full logits (not the chunked
        head or the padding-free forward), as verl turns its fused kernels off for it.
        """

        def fwd(module: torch.nn.Module, mb: Batch) -> dict[str, torch.Tensor]:
            if with_sum_pi_squared:
                logp, ent, spp = response_log_probs_and_sum_pi_squared(module, mb, temperature, with_entropy)
                return {"log_probs": logp, "sum_pi_squared": spp, **({"entropys": ent} if ent is not None else {})}
            logp, ent = self.log_probs_fn(module, mb, temperature, with_entropy)
            return {"log_probs": logp, **({"entropys": ent} if ent is not None else {})}

        return self.budget.run(batch, lambda mbs, mtl: self.engine.infer(batch, fwd, mbs, mtl))


class Actor(LogProbModel):
    """The trained policy.

    Args:
        engine: the actor's training engine.
        cfg: ``actor_rollout_ref.actor`` config.
        mini_batch_size: sequences per optimizer step (``ppo_mini_batch_size * rollout.n``).
        micro_batch_size: sequences per forward/backward.
        log_prob_micro_batch_size: sequences per forward in :meth:`compute_log_prob`.
        max_token_len, log_prob_max_token_len: token budgets (dynamic batching) for the update
            and for :meth:`compute_log_prob`; None = fixed micro-batch sizes.
        remove_padding: padding-free forwards (``model.use_remove_padding``).
        head_chunk_size: see :class:`LogProbModel` (also used by a policy loss's own forward).
        rollout_correction: ``algorithm.rollout_correction``; with ``bypass_mode`` the old
            log-probs are the rollout's, and each micro-batch's importance weights and rejection
            mask are computed against the policy being trained (verl's bypass loss).  In decoupled
            mode the batch brings ``rollout_is_weights`` (the trainer's) and its rejected mask.

    The policy loss (``policy_loss.loss_mode``) may bring hooks
    (:class:`~rlforge.algorithms.loss_hooks.PolicyLossHooks`): its own training forward (for the
    modules it added to the engine's module; always the padded one) and per-row inputs computed
    over the whole batch before the split.
    """

    def __init__(
        self, engine: TrainEngine, cfg: Any, mini_batch_size: int, micro_batch_size: int,
        log_prob_micro_batch_size: int, max_token_len: int | None = None,
        log_prob_max_token_len: int | None = None, remove_padding: bool = False, head_chunk_size: int = 0,
        rollout_correction: Any = None,
    ) -> None:
        super().__init__(engine, log_prob_micro_batch_size, log_prob_max_token_len, remove_padding, head_chunk_size)
        self.train_budget = MicroBudget(micro_batch_size, max_token_len)
        """The update's micro-batching (online back-off may lower it: :mod:`rlforge.trainer.backoff`)."""
        self.cfg = cfg
        self.mini_batch_size = mini_batch_size
        self.policy_loss = POLICY_LOSSES.get(cfg.policy_loss.loss_mode)
        self.hooks = loss_hooks(self.policy_loss)
        rc = rollout_correction
        self.bypass = rc if rc is not None and rc.bypass_mode else None

    def _forward(self, module: torch.nn.Module, mb: Batch, temperature: float,
                 need_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor]]:
        """The training forward: the loss's own (hooks) or the plain log-probs, with no extra inputs."""
        if self.hooks.forward is not None:
            return self.hooks.forward(module, mb, temperature, need_entropy, self.head_chunk_size)
        logp, ent = self.log_probs_fn(module, mb, temperature, need_entropy)
        return logp, ent, {}

    def _loss_fn(self, temperature: float, record: list[tuple[torch.Tensor, ...]] | None = None,
                 extra_keys: tuple[str, ...] = ()):
        """The update's loss.  ``record`` (on-policy): each micro-batch's ``(row_index, detached
        log-probs, detached entropy)`` is appended, and the detached log-probs are the old ones.
        ``extra_keys``: micro-batch tensors handed to the loss in ``PolicyLossInputs.extra``."""
        cfg = self.cfg

        def loss_fn(module: torch.nn.Module, mb: Batch, scale: LossScale) -> tuple[torch.Tensor, dict[str, Any]]:
            need_entropy = cfg.entropy_coeff != 0 or record is not None
            logp, ent, fields = self._forward(module, mb, temperature, need_entropy)
            if record is not None:
                assert ent is not None
                record.append((mb["row_index"], logp.detach(), ent.detach()))
                old = logp.detach()
                if cfg.entropy_coeff == 0:
                    ent = None  # computed for the metric only
            else:
                old = mb["old_log_probs"]
            mask = mb["response_mask"].float()
            weights = mb["rollout_is_weights"] if "rollout_is_weights" in mb else None
            corr_metrics: dict[str, Any] = {}
            if self.bypass is not None:  # old = the rollout's log-probs; weights and rejection against pi_theta
                corr = compute_rollout_correction(logp.detach(), old, mask, self.bypass)
                mask, weights, corr_metrics = corr.response_mask, corr.weights, corr.metrics
            glob = dict(global_num_tokens=scale.global_num_tokens, global_num_seqs=scale.global_num_seqs,
                        dp_size=scale.dp_size)
            inputs = PolicyLossInputs(
                old_log_prob=old, log_prob=logp, advantages=mb["advantages"],
                response_mask=mask, loss_agg_mode=cfg.loss_agg_mode, **glob,
                ref_log_prob=mb["ref_log_prob"] if "ref_log_prob" in mb else None,
                token_level_rewards=mb["token_level_rewards"] if "token_level_rewards" in mb else None,
                index=mb.non_tensor.get("uid"),
                extra={k: mb[k] for k in extra_keys if k in mb},
                rollout_is_weights=weights,
                **fields,
            )
            out = self._policy_loss(inputs)
            loss = out.loss
            # detached device tensors: the engine reads every metric of the step back in one copy
            metrics: dict[str, Any] = {"pg_loss": out.loss.detach(), **out.metrics, **corr_metrics}
            if ent is not None:
                ent_loss = agg_loss(ent, mask, cfg.loss_agg_mode, **glob)
                loss = loss - cfg.entropy_coeff * ent_loss
            if cfg.use_kl_loss:
                kl_term = kl_loss(logp, mb["ref_log_prob"], mask, cfg.kl_loss_type, cfg.loss_agg_mode, **glob)
                loss = loss + cfg.kl_loss_coef * kl_term
                metrics["kl_loss"] = kl_term.detach()
                metrics["kl_coef"] = float(cfg.kl_loss_coef)
            return loss, metrics

        return loss_fn

    def _policy_loss(self, inputs: PolicyLossInputs) -> PolicyLossOutput:
        """The configured policy loss; under bypass mode verl's bypass loss instead: ``ppo_clip`` =
        the PPO clip against the rollout's log-probs with no importance weights (the ratio is the
        correction), ``reinforce`` = ``-w * A * log pi`` (:func:`reinforce_loss_matrix`)."""
        if self.bypass is None:
            return self.policy_loss(inputs, self.cfg)
        weights, inputs.rollout_is_weights = inputs.rollout_is_weights, None
        if self.bypass.loss_type == "ppo_clip":
            return self.policy_loss(inputs, self.cfg)
        loss = inputs.agg(reinforce_loss_matrix(inputs.log_prob, inputs.advantages, weights))
        kl = masked_mean(inputs.old_log_prob - inputs.log_prob.detach(), inputs.response_mask)
        return PolicyLossOutput(loss=loss, metrics={"ppo_kl": kl})

    def update(self, batch: Batch, temperature: float, on_policy: bool = False) -> UpdateResult:
        """PPO update over ``batch``; returns ``actor/*`` metrics (without the prefix) and the work
        the shared-prompt layout saved (:class:`~rlforge.roles.common.UpdateResult`).

        ``on_policy``: ``batch`` has no ``old_log_probs``; it must be consumed by one optimizer
        step (one epoch, one mini-batch), whose forward gives the old log-probs (detached, so the
        ratio is 1 and the gradient is the policy gradient at the current policy).  That
        forward's log-probs and entropies, ``(batch, response_len)`` float32 on CPU (0 past each
        response), come back as the result's ``forward`` (``log_probs`` and ``entropys``).

        Raises ValueError when ``on_policy`` and the update would take more than one step.
        """
        keys = ["prompts", "input_ids", "attention_mask", "position_ids", "responses", "response_mask", "advantages"]
        keys += [k for k in ("old_log_probs", "ref_log_prob", "token_level_rewards", "rollout_is_weights") if k in batch]
        uid = {"uid": batch.non_tensor["uid"]} if "uid" in batch.non_tensor else {}
        data = Batch(batch.tensors.select(*keys), uid, split_meta(batch))
        extra: dict[str, torch.Tensor] = {}
        if self.hooks.batch_inputs is not None:
            rewards = batch["token_level_rewards"] if "token_level_rewards" in batch else None
            extra = self.hooks.batch_inputs(self.cfg, rewards, uid.get("uid"))
        for k, v in extra.items():
            data[k] = v
        record: list[tuple[torch.Tensor, ...]] | None = None
        if on_policy:
            steps = data.meta.get("num_mini_batches", -(-len(batch) // max(1, self.mini_batch_size)))
            if self.cfg.ppo_epochs != 1 or steps > 1:
                raise ValueError(f"on-policy update of {len(batch)} rows needs one optimizer step, but ppo_epochs="
                                 f"{self.cfg.ppo_epochs} and the mini-batch is {self.mini_batch_size} rows")
            data["row_index"] = torch.arange(len(batch))
            record = []
        result = run_updates(
            self.engine, data, self._loss_fn(temperature, record, tuple(extra)), self.mini_batch_size,
            self.train_budget, self.cfg.ppo_epochs, "update_actor",
            on_redo=record.clear if record is not None else None,  # on-policy: one mini-batch, recorded anew
        )
        if record is not None:
            rows = _assemble_rows(record, len(batch), batch["responses"].shape[1])
            keep = batch["response_mask"].cpu().float()
            result.forward = {k: v * keep for k, v in rows.items()}
        return result


def _assemble_rows(record: list[tuple[torch.Tensor, ...]], rows: int, width: int) -> dict[str, torch.Tensor]:
    """Micro-batch ``(row_index, log_probs, entropys)`` back into ``(rows, width)`` CPU float32 tensors in
    row order (a micro-batch may be narrower than ``width``, cut to its own longest response, or wider)."""
    out = {"log_probs": torch.zeros(rows, width), "entropys": torch.zeros(rows, width)}
    seen = torch.zeros(rows, dtype=torch.bool)
    for idx, logp, ent in record:
        idx, w = idx.cpu(), min(logp.shape[1], width)  # a wider micro-batch carries only padding past `width`
        out["log_probs"][idx, :w] = logp[:, :w].float().cpu()
        out["entropys"][idx, :w] = ent[:, :w].float().cpu()
        seen[idx] = True
    if not bool(seen.all()):
        raise RuntimeError(f"the update's forward saw {int(seen.sum())} of {rows} rows")
    return out


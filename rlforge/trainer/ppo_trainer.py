"""The RL step loop (PPO / GRPO and relatives), single controller.

One step, each stage timed as ``timing_s/<stage>`` (see docs/architecture.md):

    gen (-> gen_max) -> reward -> old_log_prob -> ref -> values -> adv -> update_critic -> update_actor

``adv`` starts with rollout correction (``algorithm.rollout_correction``: importance weights and
rejection between the rollout's and the old log-probs); under its ``bypass_mode`` the rollout's
log-probs are the old ones and ``old_log_prob`` does not run.

``gen_max`` (a greedy rollout per prompt, whose score is the baseline) runs for estimators
that declare ``needs_reward_baselines`` (ReMax).  With DAPO dynamic sampling
(``algorithm.filter_groups``) gen and reward repeat until enough groups qualify.

``ref`` runs only with ``actor.use_kl_loss`` or ``algorithm.use_kl_in_reward``; ``values``
and ``update_critic`` only with a critic (``adv_estimator=gae``); ``update_actor`` starts
after ``trainer.critic_warmup`` steps.

Every ``timed`` block reports to the rank's :class:`~rlforge.perf.monitor.PerfMonitor` timeline,
which gives the per-stage GPU utilisation and, with ``trainer.profile``, the stage trace.  A CUDA
out-of-memory error in a stage first lowers that stage's micro-batch budget (or turns on
checkpointing) and redoes its work, where the tuner owns those keys (:mod:`rlforge.trainer.backoff`);
otherwise it becomes one message naming the stage, the memory and the keys that lower it
(:mod:`rlforge.trainer.oom`).
"""

from __future__ import annotations

import random
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rlforge.algorithms import (
    ADV_ESTIMATORS,
    AdvantageInputs,
    agg_loss,
    apply_kl_penalty,
    build_kl_controller,
)
from rlforge.algorithms.rollout_correction import compute_rollout_correction
from rlforge.batch import Batch
from rlforge.config import format_config
from rlforge.config.sharding import batch_layout
from rlforge.engine.balance import balance_across_ranks, seqlen_metrics
from rlforge.errors import RLForgeError
from rlforge.perf.flops import device_peak_flops
from rlforge.perf.memory import StageMemory, memory_metrics
from rlforge.perf.monitor import PerfMonitor
from rlforge.perf.timer import timed
from rlforge.rewards.model_reward import reward_metrics
from rlforge.rollout import SamplingParams
from rlforge.tracking import Tracking, check_loggers, rotate_metrics_file
from rlforge.trainer import ppo_state, spmd
from rlforge.trainer.backoff import install_backoff
from rlforge.trainer.build import Job, build_job
from rlforge.trainer.checkpointer import Checkpointer
from rlforge.trainer.dynamic_sampling import kept_groups, select_groups, sequence_metric
from rlforge.trainer.metrics import (
    data_metrics,
    mfu_metrics,
    rollout_probs_diff_metrics,
    throughput_metrics,
    tokens_per_hour,
)
from rlforge.trainer.on_policy import skips_old_log_prob
from rlforge.trainer.oom import oom_guard
from rlforge.trainer.partial_rollout import PartialRollout
from rlforge.trainer.reward_components import gdpo_metrics, reward_components
from rlforge.trainer.run_folder import check_run_folder, interrupted_message, record_config
from rlforge.trainer.run_lock import acquire as acquire_run_lock
from rlforge.trainer.sample_shards import StepSharding
from rlforge.trainer.validation import validate
from rlforge.tune.inprocess import probe_at_start


def _config_dict(cfg: Any) -> dict[str, Any]:
    """The resolved config as plain dicts and lists (what wandb and mlflow record)."""
    from omegaconf import OmegaConf

    out = OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)
    return out if isinstance(out, dict) else {}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class PPOTrainer:
    """Runs a job described by an :class:`~rlforge.config.RLForgeConfig`.

    Args:
        cfg: the validated config.
        loggers: logger names (``trainer.logger`` filtered to the available ones).
    """

    def __init__(self, cfg: Any, loggers: list[str]) -> None:
        self.cfg = cfg
        check_loggers(loggers)  # a missing logger package fails before the model loads
        self.lock, made = ppo_state.take_run_lock(cfg.trainer)  # before anything is built: a second run stops at once
        try:
            self._settle_folder()  # another run's output in the folder: stop, or a fresh sub-folder (disable)
            self._setup(loggers)
        except BaseException:
            self._release_lock()
            ppo_state.remove_if_empty(made)  # a run that never started leaves no empty folder behind
            raise

    def _setup(self, loggers: list[str]) -> None:
        cfg = self.cfg
        seed_everything(int(cfg.data.seed if cfg.data.seed is not None else 1))
        self.job: Job = build_job(cfg)  # initialises the process group when launched by torchrun
        self.rank, self.world_size = spmd.world()
        seed_everything(int(cfg.data.seed if cfg.data.seed is not None else 1) + self.rank)  # per-rank sampling
        self.backoff = install_backoff(cfg, self.job, self.world_size)  # out of memory: lower the budget, redo
        self.tune_metrics = probe_at_start(cfg, self.job, self.world_size)  # GPU: the best few levers measured
        self.peak_flops = device_peak_flops(self.job.device)
        self.kl_ctrl = build_kl_controller(cfg.algorithm.kl_ctrl)
        self.adv_fn = ADV_ESTIMATORS.get(cfg.algorithm.adv_estimator)
        self.shards = StepSharding(batch_layout(cfg, self.world_size), self.rank)  # rlforge.config.sharding
        self.skip_old_log_prob = skips_old_log_prob(cfg)  # see rlforge.trainer.on_policy
        # async_training.partial_rollout: a pool of prompt groups carried between steps (None when off)
        self.partial = PartialRollout.from_config(cfg, self.job.rollout, self.job.train_loader, self.world_size,
                                                  self.adv_fn)
        self.global_step = 0
        self.checkpointer = Checkpointer(self.rank)
        # rank 0's folder (a run-<id> sub-folder: on_existing_run=append, or resume_mode=disable); recorded in config.yaml
        self.out_dir = self._rank0(str(self.lock.folder) if self.lock is not None else cfg.trainer.default_local_dir)
        cfg.trainer.default_local_dir = self.out_dir
        self._resume()
        if self.rank == 0:
            record_config(self.out_dir, format_config(cfg))  # which run this folder holds (rlforge.trainer.run_folder)
        if self.global_step == 0 and self.rank == 0:
            rotate_metrics_file(Path(self.out_dir))
        self.stage_memory = StageMemory()
        self.perf = PerfMonitor.from_config(cfg.trainer, self.rank, self.job.device, self.out_dir,
                                            cfg.global_profiler)
        self.tracker = Tracking(loggers if self.rank == 0 else [], self.out_dir, cfg.trainer.project_name,
                                cfg.trainer.experiment_name, _config_dict(cfg) if self.rank == 0 else None)

    def _rank0(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (``value`` itself in one process)."""
        return spmd.gather_objects(value)[0] if self.world_size > 1 else value

    def _settle_folder(self) -> None:
        """Rank 0: check the run folder against the run it already holds
        (:func:`rlforge.trainer.run_folder.check_run_folder`); when the run moves to a fresh
        sub-folder (``resume_mode=disable``), its lock moves with it."""
        if self.lock is None:
            return
        folder = check_run_folder(self.lock.folder, format_config(self.cfg), str(self.cfg.trainer.resume_mode))
        if folder != self.lock.folder:
            moved = acquire_run_lock(folder, "error")
            self.lock.release()
            self.lock = moved

    def _release_lock(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # ------------------------------------------------------------------ checkpoints (rlforge.trainer.ppo_state)
    def _resume(self) -> None:
        ppo_state.resume(self)

    def _save(self) -> None:
        ppo_state.save(self)

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, float]:
        """Train for ``total_steps``; return the last step's metrics."""
        t = self.cfg.trainer
        last: dict[str, float] = {}
        try:
            if self.job.val_loader is not None and t.val_before_train and self.global_step == 0:
                val = self._validate()
                self.tracker.log(val, step=0)
                if t.val_only:
                    return val
            save_s: float | None = None
            while self.global_step < self.job.total_steps:
                self.global_step += 1
                with self.perf.step(self.global_step):
                    last = self.step()
                is_last = self.global_step == self.job.total_steps
                if self.job.val_loader is not None and t.test_freq > 0 and (
                    self.global_step % t.test_freq == 0 or is_last
                ):
                    last.update(self._validate())
                if save_s is not None:  # the previous step's save, as training saw it
                    last["timing_s/save_checkpoint"], save_s = save_s, None
                self.tracker.log(last, step=self.global_step)  # before the save: a crash after it loses no row
                self.perf.flush()
                if t.save_freq > 0 and (self.global_step % t.save_freq == 0 or is_last):
                    start = time.perf_counter()
                    self._save()
                    save_s = time.perf_counter() - start
            start = time.perf_counter()
            self.checkpointer.close()  # the last save in flight is written and committed before the run ends
            if save_s is not None and self.rank == 0:  # the final save: no later metrics row carries its time
                wait_s = time.perf_counter() - start
                print(f"saved the final checkpoint (step {self.global_step}) in {save_s:.1f} s as training saw it"
                      + (f", then {wait_s:.1f} s waiting for its asynchronous write" if wait_s >= 0.05 else ""),
                      flush=True)
        except KeyboardInterrupt:
            if self.rank == 0:
                actor_ckpt = self.cfg.actor_rollout_ref.actor.checkpoint
                print(interrupted_message(self.out_dir, self.global_step, t.save_freq, actor_ckpt.save_contents),
                      file=sys.stderr, flush=True)
            raise
        finally:
            self.job.reward.close()
            self.tracker.close()
            self.perf.close()
            self._release_lock()
        return last

    def _validate(self) -> dict[str, float]:
        m: dict[str, float] = {}
        with self._stage("testing", m):
            m.update(
                validate(self.job.val_loader, self.job.rollout, self.job.reward,
                         self.cfg.actor_rollout_ref.rollout, self.cfg.data.max_response_length)
            )
        m.update(spmd.reduce_metrics(self.perf.stage_metrics("testing")))
        return m

    @contextmanager
    def _stage(self, name: str, m: dict[str, float]) -> Iterator[None]:
        """A timed stage (``timing_s/<name>`` in ``m``, and the rank's timeline) whose CUDA
        out-of-memory error, where online back-off did not redo the work, becomes one message naming
        the stage and the keys to change (:func:`rlforge.trainer.oom.oom_guard`)."""
        with timed(name, m, self.perf.timeline), self.stage_memory.track(name, m), \
                oom_guard(name, self.cfg, note=self.backoff.note):
            yield

    def _sampling(self) -> SamplingParams:
        r = self.cfg.actor_rollout_ref.rollout
        return SamplingParams(
            temperature=float(r.temperature), top_p=float(r.top_p), top_k=int(r.top_k),
            do_sample=bool(r.do_sample), max_new_tokens=int(self.cfg.data.max_response_length),
        )

    def _old_log_prob_metrics(self, batch: Batch, out: dict[str, torch.Tensor]) -> dict[str, float]:
        """``actor/entropy`` and (with rollout log-probs) ``training/rollout_probs_diff_*`` from
        the old policy's log-probs and entropies ``out`` (``(batch, response_len)``)."""
        m: dict[str, float] = {}
        if not len(batch):  # no sample on this rank this step
            return m
        if "rollout_log_probs" in batch:
            m.update(rollout_probs_diff_metrics(batch["rollout_log_probs"], out["log_probs"], batch["response_mask"]))
        m["actor/entropy"] = float(
            agg_loss(out["entropys"], batch["response_mask"].float(), self.cfg.actor_rollout_ref.actor.loss_agg_mode)
        )
        return m

    def _old_log_probs(self, batch: Batch, m: dict[str, float], bypass: bool, on_policy: bool) -> None:
        """``old_log_probs`` (and ``sum_pi_squared`` where asked): the rollout's under verl's bypass
        mode (no forward), none when on-policy (the update's forward gives them), else the
        ``old_log_prob`` stage's forward."""
        if bypass:
            batch["old_log_probs"] = self._rollout_log_probs(batch)
            return
        if on_policy:
            return
        arr = self.cfg.actor_rollout_ref
        with self._stage("old_log_prob", m):
            out = self.job.actor.compute_log_prob(batch, float(arr.rollout.temperature), with_entropy=True,
                                                  with_sum_pi_squared=arr.actor.calculate_sum_pi_squared)
            batch["old_log_probs"] = out["log_probs"]
            if "sum_pi_squared" in out:
                batch["sum_pi_squared"] = out["sum_pi_squared"]
            m.update(self._old_log_prob_metrics(batch, out))

    def step(self) -> dict[str, float]:
        """One RL step on the next batch of prompts; returns its metrics."""
        cfg, job = self.cfg, self.job
        arr = cfg.actor_rollout_ref
        temperature = float(arr.rollout.temperature)
        m: dict[str, float] = {}
        with self._stage("step", m):
            batch = self._collect(m)
            if cfg.trainer.balance_batch and self.shards.lay.mode != "replica_samples":  # (that one warned)
                batch = self._balance(batch, m)
            updates_actor = self.global_step > cfg.trainer.critic_warmup
            on_policy = self.skip_old_log_prob and updates_actor
            bypass = bool(cfg.algorithm.rollout_correction.bypass_mode)
            self._old_log_probs(batch, m, bypass, on_policy)
            if job.reference is not None:
                with self._stage("ref", m):
                    batch["ref_log_prob"] = job.reference.compute_log_prob(batch, temperature)["log_probs"]
            if job.critic is not None:
                with self._stage("values", m):
                    batch["values"] = job.critic.compute_values(batch)
            with self._stage("adv", m):
                if not bypass:
                    self._rollout_correction(batch, m)
                self._advantages(batch, m)
            if job.critic is not None:
                with self._stage("update_critic", m):
                    m.update({f"critic/{k}": v for k, v in job.critic.update(batch).items()})
                    job.critic.engine.lr_scheduler_step()
            saved_work = (0.0, 0.0)  # what the shared-prompt layout did not compute (actor.use_prefix_grouper)
            if updates_actor:
                with self._stage("update_actor", m):
                    result = job.actor.update(batch, temperature, on_policy)
                    m.update({k if k.startswith("rollout_corr/") else f"actor/{k}": v
                              for k, v in result.metrics.items()})
                    saved_work = result.saved_work
                    job.actor.engine.lr_scheduler_step()
                    if on_policy:  # the update's forward gave the old log-probs
                        assert result.forward is not None
                        batch["old_log_probs"] = result.forward["log_probs"]
                        m.update(self._old_log_prob_metrics(batch, result.forward))
                    m.update(job.actor.engine.metrics())  # parallel/* placement (strategy=megatron)
                if not np.isfinite(m["actor/pg_loss"]):
                    raise RLForgeError(
                        f"step {self.global_step}: the actor loss is {m['actor/pg_loss']}; the run is diverging. "
                        "Lower actor_rollout_ref.actor.optim.lr, check the rewards, or resume from an earlier checkpoint"
                    )
                job.sync_rollout()
        if len(batch):  # a rank without samples this step (rlforge.config.sharding) reports no per-sample metric
            self._sample_metrics(batch, m, saved_work)
        m.update(memory_metrics(stages=self.stage_memory))
        m.update(self.backoff.metrics())  # tune/oom_backoffs and the budgets back-off may lower
        m.update(self.tune_metrics)  # tune/probe_s and the probed candidates (rlforge.tune.inprocess)
        m["training/global_step"] = float(self.global_step)
        m["training/epoch"] = float(job.train_loader.epoch)
        m.update(self.perf.step_metrics())
        out = spmd.reduce_metrics(m)
        out.update(tokens_per_hour(out))
        return out

    def _sample_metrics(self, batch: Batch, m: dict[str, float], saved_work: tuple[float, float]) -> None:
        """The step's data, throughput and MFU metrics and the ``reward_extra/*`` means, into ``m``."""
        cfg, job = self.cfg, self.job
        arr = cfg.actor_rollout_ref
        m.update(data_metrics(batch, cfg.data.max_response_length, cfg.data.max_prompt_length, job.critic is not None,
                              length_mask=batch["rollout_response_mask"] if "rollout_response_mask" in batch else None))
        m.update(throughput_metrics(batch, m["timing_s/step"]))
        m.update(mfu_metrics(
            m, batch["attention_mask"].sum(-1).tolist(), job.rollout_model.config,
            job.critic.engine.module.config if job.critic is not None else None,
            arr.actor.ppo_epochs, cfg.critic.ppo_epochs, self.peak_flops,
            recompute=bool(arr.model.enable_gradient_checkpointing),
            head_tokens=float(batch["response_mask"].sum()) if job.actor.head_chunk_size > 0 else None,
            head_recompute=job.actor.head_chunk_size > 0, saved_work=saved_work,
        ))
        if saved_work[0] > 0:  # actor.use_prefix_grouper took effect
            m["perf/prefix_grouper/saved_tokens"], m["perf/prefix_grouper/saved_s2"] = saved_work
        for key, values in batch.non_tensor.items():
            if key.startswith("reward_extra/"):
                arr = np.asarray(values, dtype=np.float64)
                arr = arr[np.isfinite(arr)]  # NaN = a sample without the key
                if arr.size:
                    m[f"{key}/mean"] = float(arr.mean())

    def _balance(self, batch: Batch, m: dict[str, float]) -> Batch:
        """``trainer.balance_batch``: redistribute whole prompt groups so every data-parallel
        rank gets the same number of rows and nearly the same number of tokens."""
        full = spmd.gather_batch(batch)
        seqlens = full["attention_mask"].sum(-1).tolist()
        try:
            group = self.cfg.actor_rollout_ref.rollout.n if self.shards.whole_prompts else 1  # groups may span ranks
            parts = balance_across_ranks(seqlens, self.world_size, group_size=group)
        except ValueError:  # uneven group counts (dynamic sampling that proceeded at its limit)
            return batch
        m.update(seqlen_metrics(seqlens, parts))
        return full.select(parts[self.rank]) if self.world_size > 1 else batch

    def _generate_and_score(self, m: dict[str, float]) -> Batch:
        """Stages ``gen`` (+ ``gen_max`` for estimators that need a greedy baseline) and
        ``reward`` for this rank's share of the next batch of prompts (:mod:`rlforge.trainer.sample_shards`).
        A rank that holds no sample this step runs them on a stand-in sample, reports nothing of
        it but the stages' times, and returns an empty batch.  With ``async_training.partial_rollout``
        (one process) the batch is the first groups to finish (:mod:`rlforge.trainer.partial_rollout`)."""
        job = self.job
        if self.partial is not None:
            version = max(0, self.global_step - 1 - int(self.cfg.trainer.critic_warmup))  # actor updates so far
            with self._stage("gen", m):
                batch = self.partial.collect(version, self._sampling(), m)
            m.update(job.rollout.metrics())
            batch = self._score(batch, m, m)
            batch.meta.update(self.shards.meta())
            return batch
        share = self.shards.take(job.train_loader.next_batch())
        own: dict[str, float] = {} if share.empty else m  # the stand-in's rollout and reward metrics: dropped
        with self._stage("gen", m):
            batch = job.rollout.generate(share.samples, self._sampling())
        own.update(job.rollout.metrics())
        if getattr(self.adv_fn, "needs_reward_baselines", False):
            with self._stage("gen_max", m):
                greedy = job.rollout.generate(share.prompts, replace(self._sampling(), do_sample=False))
                baseline = job.reward.score(greedy).scores
            batch["reward_baselines"] = baseline[torch.as_tensor(share.prompt_of_sample)]
        batch = self._score(batch, m, own)
        batch.meta.update(self.shards.meta())
        return batch.select(np.zeros(0, dtype=np.int64)) if share.empty else batch

    def _score(self, batch: Batch, m: dict[str, float], own: dict[str, float]) -> Batch:
        """Stage ``reward`` (timed into ``m``): ``token_level_scores`` and the reward's extras; its metrics
        into ``own`` (``m``, or a dict that is dropped for a stand-in sample)."""
        job = self.job
        with self._stage("reward", m):
            rw = job.reward.score(batch)
            own.update(reward_metrics(job.reward))  # reward model / judge (rlforge.rewards.model_reward)
            batch["token_level_scores"] = rw.token_level_scores
            for k, v in rw.metrics.items():  # reward/timeouts, reward/errors: summed over dynamic-sampling batches
                own[k] = own.get(k, 0.0) + v
            for k, v in rw.extra.items():
                batch.non_tensor[f"reward_extra/{k}"] = np.asarray(v, dtype=object)
        return batch

    def _collect(self, m: dict[str, float]) -> Batch:
        """Generate and score ``data.train_batch_size`` prompt groups; with DAPO dynamic
        sampling (``algorithm.filter_groups.enable``) keep generating until that many groups
        with a non-zero spread are found or ``max_num_gen_batches`` is reached.

        With several ranks the loop runs in lockstep: every rank draws the same number of
        prompt batches (a rank that is already full only advances its loader), so the
        loaders stay in step and the limit and its error are decided by all ranks together.
        """
        fg = self.cfg.algorithm.filter_groups
        if not fg.enable:
            return self._generate_and_score(m)
        want = int(self.cfg.data.train_batch_size) // self.world_size  # groups per rank
        kept: list[Batch] = []
        num_kept = num_dropped = num_gen = 0
        while not spmd.all_ranks(num_kept >= want):
            if fg.max_num_gen_batches > 0 and num_gen >= fg.max_num_gen_batches:
                if not fg.proceed_on_limit or not spmd.all_ranks(num_kept > 0):
                    raise RLForgeError(
                        f"dynamic sampling kept {num_kept} of {want} prompt groups after "
                        f"algorithm.filter_groups.max_num_gen_batches={fg.max_num_gen_batches} generation batches "
                        "(the rest had zero reward spread). Raise max_num_gen_batches (0 = no limit), use easier "
                        "data, or set algorithm.filter_groups.proceed_on_limit=true to train on what was kept."
                        if not fg.proceed_on_limit
                        else f"dynamic sampling kept no prompt group in {num_gen} generation batches "
                        "(algorithm.filter_groups.max_num_gen_batches): every group had zero reward spread, "
                        "so there is nothing to train on. Use easier data or raise max_num_gen_batches."
                    )
                break
            num_gen += 1
            if num_kept >= want:  # this rank is full; keep its loader in step with the others
                self.job.train_loader.next_batch()
                continue
            batch = self._generate_and_score(m)
            uids = kept_groups(batch.non_tensor["uid"], sequence_metric(batch, fg.metric))
            uids = uids[: want - num_kept]
            num_dropped += len(set(batch.non_tensor["uid"].tolist())) - len(uids)
            num_kept += len(uids)
            if uids:
                kept.append(select_groups(batch, uids))
        m["train/num_gen_batches"] = float(num_gen)
        m["filter_groups/kept"] = float(num_kept)  # per rank; the logged value is the mean over ranks
        m["filter_groups/dropped"] = float(num_dropped)
        return Batch.concat(kept)

    def _rollout_log_probs(self, batch: Batch) -> torch.Tensor:
        if "rollout_log_probs" not in batch:
            raise RLForgeError("algorithm.rollout_correction needs the rollout's log-probs, but the rollout returned "
                               "none (actor_rollout_ref.rollout.calculate_log_probs; rollout.name=native)")
        return batch["rollout_log_probs"]

    def _rollout_correction(self, batch: Batch, m: dict[str, float]) -> None:
        """verl's decoupled rollout correction, between the old log-probs and the advantages
        (:mod:`rlforge.algorithms.rollout_correction`): ``rollout_is_weights`` added to the batch
        (they multiply the policy loss per token), rejected tokens dropped from ``response_mask``
        (the rollout's mask kept as ``rollout_response_mask`` for the length metrics), and
        ``rollout_corr/*`` metrics.  With correction off but rollout log-probs present, only the
        off-policy metrics (as verl)."""
        rc = self.cfg.algorithm.rollout_correction
        on = rc.rollout_is is not None or rc.rollout_rs is not None
        if not on and ("rollout_log_probs" not in batch or "old_log_probs" not in batch):
            return  # diagnostics only, and no old log-probs to compare with (on-policy: the stage was skipped)
        mask = batch["response_mask"]
        corr = compute_rollout_correction(batch["old_log_probs"], self._rollout_log_probs(batch), mask, rc,
                                          sum_over_ranks=self._sum_over_ranks)
        if corr.weights is not None:
            batch["rollout_is_weights"] = corr.weights
        if rc.rollout_rs is not None:
            batch["rollout_response_mask"] = mask
            batch["response_mask"] = corr.response_mask
        m.update({k: float(v) for k, v in corr.metrics.items()})

    def _sum_over_ranks(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` summed over the data-parallel ranks (``x`` itself in one process)."""
        return torch.stack([t for t in spmd.gather_objects(x.cpu())]).sum(0) if self.world_size > 1 else x

    def _advantages(self, batch: Batch, m: dict[str, float]) -> None:
        alg = self.cfg.algorithm
        if alg.use_kl_in_reward:
            rewards, kl_m = apply_kl_penalty(
                batch["token_level_scores"], batch["old_log_probs"], batch["ref_log_prob"],
                batch["response_mask"].float(), self.kl_ctrl, alg.kl_penalty,
            )
            batch["token_level_rewards"] = rewards
            m.update(kl_m)
        else:
            batch["token_level_rewards"] = batch["token_level_scores"]
        components = None
        if getattr(self.adv_fn, "needs_reward_components", False):  # gdpo
            components = reward_components(batch, alg.gdpo_reward_keys)
            m.update(gdpo_metrics(components))
        adv, ret = self.shards.advantages(  # whole-batch statistics where groups span ranks
            self.adv_fn,
            AdvantageInputs(
                token_level_rewards=batch["token_level_rewards"], response_mask=batch["response_mask"].float(),
                index=batch.non_tensor["uid"], values=batch["values"] if "values" in batch else None,
                reward_baselines=batch["reward_baselines"] if "reward_baselines" in batch else None,
                old_log_probs=batch["old_log_probs"] if "old_log_probs" in batch else None,
                sum_pi_squared=batch["sum_pi_squared"] if "sum_pi_squared" in batch else None,
                reward_components=components,
            ),
            alg,
        )
        if not (torch.isfinite(adv).all() and torch.isfinite(ret).all()):
            raise RLForgeError(
                f"step {self.global_step}: algorithm.adv_estimator={self.cfg.algorithm.adv_estimator} gave non-finite "
                f"advantages (rewards range {float(batch['token_level_rewards'].min()):.3g} .. "
                f"{float(batch['token_level_rewards'].max()):.3g}); check the reward function's scale"
            )
        batch["advantages"] = adv
        batch["returns"] = ret

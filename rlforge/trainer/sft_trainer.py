"""Supervised fine-tuning: ``python -m rlforge.trainer.sft_trainer key=value ...`` (also ``rlforge sft``).

verl's SFT keys (:mod:`rlforge.config.sft`).  The same pieces as ``rlforge train``'s actor: the model
loader, the training engine (``model.strategy``: FSDP2 or FSDP1, one code path for 1..N ranks: a
plain ``python`` launch runs a one-rank process group, ``torchrun --nproc_per_node=N`` N ranks),
the padding-free forward (``model.use_remove_padding``), token-budget micro-batches
(``data.use_dynamic_bsz``), LoRA, the checkpoint writer.  ``engine.*`` are the engine's FSDP settings
(sharding, ``param_offload``/``optimizer_offload``/``offload_policy``, dtypes), as a PPO role's ``fsdp_config``.

Loss: token-mean cross-entropy over the loss-mask tokens (the assistant turns,
:mod:`rlforge.data.sft_dataset`) of the global batch, ``-Σ log p(token) / Σ mask``, over all ranks
and micro-batches, as verl's SFT trainer.  A sample is laid out as the roles' rows are: its first
token is the "prompt", the rest the "response", so the actor's response log-probs (padded or packed)
are the next-token log-probs.

Data order: the training samples are shuffled per epoch (seed ``trainer.seed + epoch``); a global batch
is ``data.train_batch_size`` consecutive samples of that order, split into equal contiguous parts, one
per rank; an incomplete last batch is dropped.

Output: ``<trainer.default_local_dir>/global_step_N/`` with ``model/state.pt`` (the engine's full state:
weights or, with LoRA, the adapter, plus optimizer and scheduler), ``trainer_state.pt`` (the step and
the RNG states), ``config.yaml`` and
``huggingface/``: a Hugging Face folder (model + tokenizer; with LoRA the adapter merged in) that
``rlforge train actor_rollout_ref.model.path=...`` takes, as verl's SFT checkpoint's ``huggingface``.

Resume (``trainer.resume_mode``, verl's default ``auto``): a run whose ``default_local_dir`` holds a
checkpoint (or with ``resume_from_path``) goes on from it: :mod:`rlforge.trainer.sft_resume`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import transformers

from rlforge.config.sft import SFTConfig, check_micro_batch, load_sft_config
from rlforge.errors import ConfigError, DataError, RLForgeError
from rlforge.trainer.sft_args import add_sft_arguments

HF_FOLDER = "huggingface"
"""Sub-folder of ``global_step_N`` holding the Hugging Face model (verl's SFT checkpoint layout)."""


def sft_loss_fn(log_probs_fn: Any):
    """The engine's loss function: token-mean cross-entropy against the global token count
    (``LossScale.global_num_tokens``), so micro-batch and rank shares sum to the batch loss."""
    from rlforge.algorithms import agg_loss

    def loss_fn(module: torch.nn.Module, mb: Any, scale: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        logp, _ = log_probs_fn(module, mb, 1.0, False)
        loss = agg_loss(-logp, mb["response_mask"], "token-mean", global_num_tokens=scale.global_num_tokens,
                        dp_size=scale.dp_size)
        return loss, {"train/loss": loss.detach()}

    return loss_fn


class SFTTrainer:
    """One SFT run (see the module docstring).  Build, then :meth:`fit`.

    Raises:
        ConfigError / DataError: bad config values or data (one message naming the key or row).
    """

    def __init__(self, cfg: SFTConfig) -> None:
        from rlforge.engine.distributed import get_rank, get_world_size, init_distributed, init_single_process
        from rlforge.models import load_tokenizer
        from rlforge.trainer.builders.engines import pick_device

        self.cfg = cfg
        device = pick_device(cfg.trainer.device)
        info = init_distributed(device.type) if "WORLD_SIZE" in os.environ else init_single_process(device)
        self.device, self.rank, self.world = info.device, get_rank(), get_world_size()
        torch.manual_seed(cfg.trainer.seed)
        self.tokenizer = load_tokenizer(cfg.model.path, cfg.model.tokenizer_path, key="model.path")
        self.train = self._samples(cfg.data.train_files, "train", cfg.data.train_max_samples)
        self.val = self._samples(cfg.data.val_files, "val", cfg.data.val_max_samples) if cfg.data.val_files else []
        self.steps_per_epoch = self._steps_per_epoch()
        t = cfg.trainer
        self.total_steps = int(t.total_training_steps or t.total_epochs * self.steps_per_epoch)
        self._build_engine()
        self.global_step = 0
        self.resumed_from = self._resume()

    def _samples(self, files: Any, split: str, max_samples: int) -> list[Any]:
        from rlforge.data.sft_dataset import load_chats, tokenize_all

        chats, origins = load_chats(files, self.cfg.data, split, self.cfg.trainer.seed, max_samples)
        key = "data.train_files" if split == "train" else "data.val_files"
        if not chats:
            raise DataError(f"{key}={files}: no samples")
        return tokenize_all(self.tokenizer, chats, origins, self.cfg.data)

    def _steps_per_epoch(self) -> int:
        bs = int(self.cfg.data.train_batch_size)
        if bs % self.world:
            raise ConfigError(f"data.train_batch_size={bs} is not divisible by the {self.world} ranks")
        check_micro_batch(self.cfg.data, self.world)
        if bs > len(self.train):
            raise ConfigError(f"data.train_batch_size={bs} is larger than the {len(self.train)} training samples; "
                              "lower it (or add data)")
        return len(self.train) // bs

    def _build_engine(self) -> None:
        from rlforge.config.lora import lora_enabled
        from rlforge.engine.packing import packed_response_log_probs
        from rlforge.engine.varlen import maybe_select_varlen
        from rlforge.models import load_causal_lm
        from rlforge.models.lora import apply_lora
        from rlforge.roles.forward import response_log_probs
        from rlforge.trainer.builders.engines import engine_name, make_engine, packs

        m = self.cfg.model
        module = load_causal_lm(m.path, self.tokenizer, dict(m.override_config), seed=self.cfg.trainer.seed,
                                key="model.path")
        self.reference = {k: tuple(v.shape) for k, v in module.state_dict().items()}  # checks a resumed state
        packed = bool(m.use_remove_padding) and packs(m.strategy)
        maybe_select_varlen(module, self.device, packed, m.override_config)
        self.lora = apply_lora(module, m, "model", m.path, seed=self.cfg.trainer.seed) if lora_enabled(m) else None
        flags = SimpleNamespace(enable_gradient_checkpointing=m.enable_gradient_checkpointing,
                                enable_activation_offload=m.enable_activation_offload)
        self.engine = make_engine(engine_name(m.strategy), module, self.device, fsdp_config=self.cfg.engine,
                                  optim_cfg=self.cfg.optim, total_steps=self.total_steps, optim_key="optim",
                                  grad_clip=float(self.cfg.optim.clip_grad), model_cfg=flags, role_key="model",
                                  trainable_state_only=self.lora is not None)
        self.log_probs_fn = packed_response_log_probs if packed and self.engine.packed_forward else response_log_probs

    def _resume(self) -> Path | None:
        """Restore the checkpoint that ``trainer.resume_mode`` names (:mod:`rlforge.trainer.sft_resume`):
        the engine state, the RNGs and the step (the data position); returns its folder, None when fresh."""
        from rlforge.trainer.sft_resume import restore_sft, shared_checkpoint

        path = shared_checkpoint(self.cfg.trainer, self.rank)
        if path is None:
            return None
        self.global_step, changes = restore_sft(self.engine, path, _yaml(self.cfg), self.reference)
        if self.rank == 0:
            line = f"rlforge sft: resumed from {path} at step {self.global_step}"
            if changes:
                line += f"; changed since that checkpoint, taking effect now: {'; '.join(str(c) for c in changes)}"
            print(line, flush=True)
        return path

    # ------------------------------------------------------------------ batches
    def _micro(self) -> tuple[int, int | None]:
        d = self.cfg.data
        return int(d.micro_batch_size_per_gpu), (int(d.max_token_len_per_gpu) if d.use_dynamic_bsz else None)

    def batch_rows(self, step: int) -> list[int]:
        """This rank's sample indices for optimizer step ``step`` (1-based; see the module docstring)."""
        epoch, index = divmod(step - 1, self.steps_per_epoch)
        gen = torch.Generator().manual_seed(int(self.cfg.trainer.seed) + epoch)
        order = torch.randperm(len(self.train), generator=gen).tolist()
        bs = int(self.cfg.data.train_batch_size)
        rows = order[index * bs: (index + 1) * bs]
        per = bs // self.world
        return rows[self.rank * per: (self.rank + 1) * per]

    def _collate(self, samples: Sequence[Any]) -> Any:
        from rlforge.data.sft_dataset import collate

        return collate(samples, int(self.tokenizer.pad_token_id))

    def train_step(self, step: int) -> dict[str, float]:
        """One optimizer step on step ``step``'s global batch; returns ``train/loss`` (the global batch's
        token-mean loss), ``train/grad_norm`` and ``train/lr`` (the rate this step used)."""
        batch = self._collate([self.train[i] for i in self.batch_rows(step)])
        micro, budget = self._micro()
        out = self.engine.train_step(batch, sft_loss_fn(self.log_probs_fn), micro, budget)
        lr = self.engine.lr
        self.engine.lr_scheduler_step()
        loss, grad_norm = float(out.get("train/loss", 0.0)), float(out["grad_norm"])
        _check_finite(step, loss, grad_norm, lr, self.rank)
        return {"train/loss": loss, "train/grad_norm": grad_norm, "train/lr": lr}

    @torch.no_grad()
    def validate(self) -> dict[str, float]:
        """``val/loss``: token-mean cross-entropy over all validation samples (split over the ranks)."""
        from rlforge.engine.distributed import all_reduce_sum

        mine = self.val[self.rank::self.world]
        total = count = 0.0
        micro, budget = self._micro()
        for i in range(0, len(mine), max(micro, 1) * 8):
            batch = self._collate(mine[i: i + max(micro, 1) * 8])
            logp = self.engine.infer(batch, lambda mod, mb: {"lp": self.log_probs_fn(mod, mb, 1.0, False)[0]},
                                     micro, budget)["lp"]
            total += float(-(logp * batch["response_mask"]).sum())
            count += float(batch["response_mask"].sum())
        total, count = all_reduce_sum([total, count], self.device)
        return {"val/loss": total / max(count, 1.0)}

    # ------------------------------------------------------------------ saving
    def _hf_state(self) -> dict[str, torch.Tensor]:
        """The plain model's full weights (LoRA merged in), gathered on every rank (a collective)."""
        from rlforge.engine.activation import clean_name
        from rlforge.models.lora import merged_params

        params = ((clean_name(n), t) for n, t in self.engine.full_params_iter(device="cpu"))
        if self.lora is not None:
            params = merged_params(params, self.lora)
        return dict(params)

    def save(self) -> Path:
        """``global_step_N`` (see the module docstring); all ranks call it, rank 0 writes."""
        from rlforge.engine.distributed import get_world_size
        from rlforge.trainer import checkpoint as ckpt
        from rlforge.trainer.export import build_model

        rng = ckpt.rng_state()  # the training RNG, as a resume restores it: the export below may draw from it
        state = self.engine.state_dict()
        hf = self._hf_state()
        root = Path(self.cfg.trainer.default_local_dir)
        folder = root / f"global_step_{self.global_step}"
        if self.rank == 0:
            m = self.cfg.model
            source = {"path": m.path, "tokenizer_path": m.tokenizer_path, "override_config": dict(m.override_config)}
            tok, model = build_model(source, hf, folder)

            def write(out: Path) -> None:
                model.save_pretrained(out)
                tok.save_pretrained(out)

            parts = {"model": state, "trainer_state": {"global_step": self.global_step, "rng": rng}}
            ckpt.save_checkpoint(root, self.global_step, parts, self.cfg.trainer.max_ckpt_to_keep,
                                 {HF_FOLDER: write}, config=_yaml(self.cfg))
        if get_world_size() > 1:
            torch.distributed.barrier()
        ckpt.set_rng_state(rng)  # the run goes on from the state saved, as a resumed run does
        return folder

    # ------------------------------------------------------------------ loop
    def fit(self) -> dict[str, float]:
        """Train ``total_steps`` optimizer steps, validating and saving per ``trainer.test_freq`` /
        ``save_freq`` (and at the last step); returns the last step's metrics."""
        from rlforge.config.later_work import SUPPORTED_LOGGERS
        from rlforge.tracking import Tracking

        t = self.cfg.trainer
        loggers = [x for x in dict.fromkeys(t.logger) if x in SUPPORTED_LOGGERS] if self.rank == 0 else []
        tracker = Tracking(loggers, t.default_local_dir, t.project_name, t.experiment_name)
        last: dict[str, float] = {}
        try:
            while self.global_step < self.total_steps:
                self.global_step += 1
                last = self.train_step(self.global_step)
                is_last = self.global_step == self.total_steps
                if self.val and (is_last or (t.test_freq > 0 and self.global_step % t.test_freq == 0)):
                    last.update(self.validate())
                if is_last or (t.save_freq > 0 and self.global_step % t.save_freq == 0):
                    self.save()
                tracker.log(last, step=self.global_step)
        finally:
            tracker.close()
        return last


def _yaml(cfg: SFTConfig) -> str:
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def _check_finite(step: int, loss: float, grad_norm: float, lr: float, rank: int) -> None:
    """A non-finite gradient norm: the engine skipped this step's optimizer update (as verl's SFT trainer
    does); rank 0 says so.  A non-finite loss: the weights or the data no longer give a number, and every
    later step would be skipped too.

    Raises:
        RLForgeError: the loss is NaN or infinite (names the step and ``optim.lr``).
    """
    if not math.isfinite(loss):
        raise RLForgeError(f"step {step}: the SFT loss is {loss} (the weights no longer give finite log-probs; "
                           f"optim.lr={lr:g} may be too high, or a row's tokens are out of the model's range); "
                           "stopped before saving a broken model")
    if not math.isfinite(grad_norm) and rank == 0:
        print(f"rlforge sft: warning: step {step}: the gradient norm is {grad_norm}; this step's optimizer update "
              f"was skipped (lower optim.lr={lr:g} or optim.clip_grad if this repeats)", file=sys.stderr, flush=True)


def sft_start_line(cfg: Any) -> str:
    """One line naming the model, the data, the length, the device and the output folder (as ``rlforge train``'s
    start line)."""
    from rlforge.trainer.builders.engines import pick_device

    t, files = cfg.trainer, cfg.data.train_files
    steps = (f"{t.total_training_steps} steps" if t.total_training_steps is not None else f"{t.total_epochs} epochs")
    procs = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(t.device).type + (f" x {procs} processes" if procs > 1 else "")
    data = files if isinstance(files, str) else ",".join(str(f) for f in files)
    return (f"rlforge sft: start | model {cfg.model.path} | data {data} | {steps} | device {device} "
            f"| output {t.default_local_dir}")


def run_sft(overrides: Sequence[str], config_file: str | None = None, print_config: bool = False) -> int:
    """Load the config, then print it or run the SFT; returns the exit status."""
    cfg = load_sft_config(list(overrides), config_file)
    if print_config:
        print(_yaml(cfg), end="", flush=True)
        return 0
    transformers.logging.set_verbosity_error()  # as rlforge train: no library chatter or progress bars
    transformers.logging.disable_progress_bar()
    if os.environ.get("RANK", "0") == "0":  # before anything slow (model loading); under torchrun, rank 0 alone
        print(sft_start_line(cfg), flush=True)
    trainer = SFTTrainer(cfg)
    last = trainer.fit()
    if trainer.rank == 0:
        out = Path(cfg.trainer.default_local_dir) / f"global_step_{trainer.global_step}" / HF_FOLDER
        shown = ", ".join(f"{k}={v:.4g}" for k, v in last.items()) or "nothing left to train"
        print(f"rlforge sft: {trainer.global_step} steps; {shown}; model {out} "
              f"(rlforge train actor_rollout_ref.model.path={out})", flush=True)
    from rlforge.engine.distributed import finish_launched_worker

    finish_launched_worker()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rlforge.trainer.sft_trainer``: a user mistake prints one ``rlforge: error:`` line (exit 2)."""
    p = argparse.ArgumentParser(prog="rlforge sft", description="Supervised fine-tuning with verl's SFT keys.")
    add_sft_arguments(p)
    args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            return run_sft(args.overrides, args.config_file, args.print_config)
    except RLForgeError as e:
        print(f"rlforge: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())

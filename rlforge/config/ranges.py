"""Value-range checks: every float in the config is finite, and the keys below lie in their
valid ranges.  Each failure is a :class:`ConfigError` naming the full key, the value and
the valid range, before any model is loaded."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from typing import Any

from rlforge.config.rollout import VERL_ROLLOUTS
from rlforge.errors import ConfigError

_ARR = "actor_rollout_ref"

# key -> (check, description of the valid range)
RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    f"{_ARR}.actor.optim.lr": (lambda v: v >= 0, ">= 0"),
    f"{_ARR}.actor.optim.weight_decay": (lambda v: v >= 0, ">= 0"),
    f"{_ARR}.actor.optim.lr_warmup_steps_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "critic.optim.lr": (lambda v: v >= 0, ">= 0"),
    "critic.optim.weight_decay": (lambda v: v >= 0, ">= 0"),
    "critic.optim.lr_warmup_steps_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    **{f"{role}.optim.{k}": rule for role in (f"{_ARR}.actor", "critic") for k, rule in (
        ("min_lr_ratio", (lambda v: 0 <= v <= 1, "in [0, 1] (the cosine floor as a fraction of the peak lr)")),
        ("num_cycles", (lambda v: v >= 0, ">= 0 (cosine half-waves over training)")),
        ("betas", (lambda v: len(v) == 2 and all(0 <= b < 1 for b in v), "two numbers in [0, 1): AdamW's [beta1, beta2]")),
    )},
    f"{_ARR}.rollout.temperature": (lambda v: v >= 0, ">= 0 (0 = greedy)"),
    f"{_ARR}.rollout.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    f"{_ARR}.rollout.top_k": (lambda v: v == -1 or v >= 0, "-1 (off) or >= 0"),
    f"{_ARR}.rollout.val_kwargs.temperature": (lambda v: v >= 0, ">= 0 (0 = greedy)"),
    f"{_ARR}.rollout.val_kwargs.top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    f"{_ARR}.rollout.val_kwargs.top_k": (lambda v: v == -1 or v >= 0, "-1 (off) or >= 0"),
    f"{_ARR}.rollout.val_kwargs.n": (lambda v: v >= 1, ">= 1"),
    f"{_ARR}.actor.clip_ratio": (lambda v: v > 0, "> 0"),
    f"{_ARR}.actor.clip_ratio_low": (lambda v: v is None or v > 0, "> 0"),
    f"{_ARR}.actor.clip_ratio_high": (lambda v: v is None or v > 0, "> 0"),
    f"{_ARR}.actor.grad_clip": (lambda v: v is None or v >= 0, ">= 0 (0 = no clipping)"),
    "critic.grad_clip": (lambda v: v is None or v >= 0, ">= 0 (0 = no clipping)"),
    "critic.cliprange_value": (lambda v: v > 0, "> 0"),
    f"{_ARR}.actor.kl_loss_coef": (lambda v: v >= 0, ">= 0"),
    f"{_ARR}.actor.ppo_epochs": (lambda v: v >= 1, ">= 1"),
    f"{_ARR}.actor.ppo_max_token_len_per_gpu": (lambda v: v >= 1, ">= 1"),
    f"{_ARR}.rollout.log_prob_max_token_len_per_gpu": (lambda v: v >= 1, ">= 1"),
    f"{_ARR}.ref.log_prob_max_token_len_per_gpu": (lambda v: v >= 1, ">= 1"),
    "critic.ppo_max_token_len_per_gpu": (lambda v: v >= 1, ">= 1"),
    "critic.forward_max_token_len_per_gpu": (lambda v: v >= 1, ">= 1"),
    f"{_ARR}.model.fused_kernel_options.chunk_size": (lambda v: v >= 1, ">= 1 (tokens per chunk)"),
    "algorithm.gamma": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "algorithm.lam": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "algorithm.kl_ctrl.kl_coef": (lambda v: v >= 0, ">= 0"),
    "data.max_prompt_length": (lambda v: v >= 1, ">= 1"),
    "data.max_response_length": (lambda v: v >= 1, ">= 1"),
    "reward_model.timeout_s": (lambda v: v is None or v > 0, "null (no limit) or > 0 seconds"),
    "reward_model.num_workers": (lambda v: v >= 0, ">= 1 processes, or 0 for the CPU count (at most 16)"),
    "trainer.nnodes": (lambda v: v >= 1, ">= 1"),
    "trainer.n_gpus_per_node": (lambda v: v >= 1, ">= 1"),
    "data.gen_batch_size": (lambda v: v is None or v >= 1, "null (data.train_batch_size) or >= 1"),
    "trainer.gpu_sample_interval_s": (lambda v: v >= 0, ">= 0 (0 = no GPU sampling)"),
    "trainer.profile_steps": (lambda v: v is None or all(s >= 1 for s in v), "null or a list of steps >= 1"),
    # rollout backends: hf and native here; verl's vllm, sglang and trtllm run as native (or hf) with a warning
    f"{_ARR}.rollout.name": (lambda v: v in ("hf", "native", *VERL_ROLLOUTS),
                             "hf or native (or verl's vllm / sglang / trtllm, run as native where it applies)"),
    f"{_ARR}.rollout.max_num_seqs": (lambda v: v >= 1, ">= 1"),
    f"{_ARR}.rollout.max_num_batched_tokens": (lambda v: v >= 1, ">= 1"),
    f"{_ARR}.rollout.gpu_memory_utilization": (lambda v: 0 < v <= 1, "in (0, 1]"),
    f"{_ARR}.rollout.tensor_model_parallel_size": (lambda v: v >= 1, ">= 1"),
    f"{_ARR}.rollout.cudagraph_capture_sizes": (
        lambda v: isinstance(v, (list, tuple)) and len(v) > 0 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in v),
        "null (the default sizes) or a non-empty list of batch sizes >= 1"),
}


def _get(cfg: Any, key: str) -> Any:
    node = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _non_finite_floats(node: Any, prefix: str) -> list[tuple[str, float]]:
    bad: list[tuple[str, float]] = []
    if dataclasses.is_dataclass(node):
        for f in dataclasses.fields(node):
            bad += _non_finite_floats(getattr(node, f.name), f"{prefix}.{f.name}" if prefix else f.name)
    elif isinstance(node, float) and not math.isfinite(node):
        bad.append((prefix, node))
    return bad


SFT_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "optim.lr": (lambda v: v >= 0, ">= 0"),
    "optim.weight_decay": (lambda v: v >= 0, ">= 0"),
    "optim.lr_warmup_steps_ratio": (lambda v: 0 <= v <= 1, "in [0, 1]"),
    "optim.clip_grad": (lambda v: v >= 0, ">= 0 (0 = no clipping)"),
}
"""The SFT trainer's (:class:`rlforge.config.sft.SFTConfig`) optimizer keys, as the RL actor's above."""


def check_ranges(cfg: Any, ranges: dict[str, tuple[Callable[[Any], bool], str]] | None = None) -> None:
    """Raise :class:`ConfigError` for the first non-finite float or out-of-range value (``ranges``: the
    config's table, :data:`RANGES` for the RL config, :data:`SFT_RANGES` for the SFT one)."""
    bad = _non_finite_floats(cfg, "")
    if bad:
        key, value = bad[0]
        raise ConfigError(f"{key}={value}: must be a finite number")
    for key, (ok, valid) in (RANGES if ranges is None else ranges).items():
        value = _get(cfg, key)
        if value is not None and not ok(value):
            raise ConfigError(f"{key}={value}: must be {valid}")


_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(device: str) -> None:
    """``trainer.device``: raises ConfigError unless it is auto, cpu, cuda or cuda:<index>."""
    if not _DEVICE.match(str(device)):
        raise ConfigError(f"trainer.device={device!r}: expected auto, cpu, cuda or cuda:<index>")


def check_model_len(cfg: Any) -> None:
    """``rollout.max_model_len``, when set, must hold the longest possible sequence."""
    longest = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    limit = cfg.actor_rollout_ref.rollout.max_model_len
    if limit is not None and int(limit) < longest:
        raise ConfigError(
            f"{_ARR}.rollout.max_model_len={limit} is smaller than data.max_prompt_length + "
            f"data.max_response_length = {longest}; raise it or lower data.max_response_length"
        )


def check_token_budgets(cfg: Any) -> None:
    """With dynamic batching, every token budget must hold the longest possible sequence
    (``data.max_prompt_length + data.max_response_length``), as verl requires."""
    longest = int(cfg.data.max_prompt_length) + int(cfg.data.max_response_length)
    arr, critic = cfg.actor_rollout_ref, cfg.critic
    budgets = [
        (arr.actor.use_dynamic_bsz, f"{_ARR}.actor.ppo_max_token_len_per_gpu", arr.actor.ppo_max_token_len_per_gpu),
        (arr.rollout.log_prob_use_dynamic_bsz, f"{_ARR}.rollout.log_prob_max_token_len_per_gpu",
         arr.rollout.log_prob_max_token_len_per_gpu),
        (arr.ref.log_prob_use_dynamic_bsz, f"{_ARR}.ref.log_prob_max_token_len_per_gpu",
         arr.ref.log_prob_max_token_len_per_gpu),
        (critic.use_dynamic_bsz, "critic.ppo_max_token_len_per_gpu", critic.ppo_max_token_len_per_gpu),
        (critic.use_dynamic_bsz, "critic.forward_max_token_len_per_gpu", critic.forward_max_token_len_per_gpu),
    ]
    for on, key, value in budgets:
        if on and int(value) < longest:
            raise ConfigError(
                f"{key}={value} is smaller than the longest possible sequence, data.max_prompt_length + "
                f"data.max_response_length = {longest}; raise it to at least {longest}"
            )

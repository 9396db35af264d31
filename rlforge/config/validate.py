"""Cross-field checks of a loaded :class:`RLForgeConfig`.

:func:`validate_config` raises :class:`ConfigError` on the first error (naming the keys and
the fix) and returns warning lines for settings that are accepted but do not take effect.

Deviation from verl: verl requires one of ``ppo_micro_batch_size`` /
``ppo_micro_batch_size_per_gpu`` when ``use_dynamic_bsz`` is off; rlforge treats both unset as
"one micro batch = the whole mini batch".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlforge.config import registry_names as names
from rlforge.config.async_training import check_config as check_async_training
from rlforge.config.backends import check_backends
from rlforge.config.common import get_key
from rlforge.config.later_work import later_work_warnings
from rlforge.config.lora import adapter_path_overrides, check_lora_keys, lora_enabled
from rlforge.config.parallel_dims import parallel_dims
from rlforge.config.precision import check_precision_and_offload
from rlforge.config.ranges import check_device, check_model_len, check_ranges, check_token_budgets
from rlforge.config.reward import check_model_reward
from rlforge.config.rollout_correction_check import check_config as check_rollout_correction
from rlforge.config.rollout_correction_check import is_enabled as rollout_correction_on
from rlforge.config.root import RLForgeConfig, uses_critic
from rlforge.config.sharding import check_batch_sharding
from rlforge.config.split_trainer import split_batch_warnings
from rlforge.config.world import run_world
from rlforge.errors import ConfigError
from rlforge.trainer.on_policy import skips_old_log_prob

__all__ = ["CHOICES", "uses_ref", "validate_config"]

_ARR = "actor_rollout_ref"
_LOSS_AGG = names.LOSS_AGG_MODES.names
_KL = names.KL_ESTIMATORS.names
_STRATEGIES = ("fsdp", "fsdp2", "megatron")

CHOICES: dict[str, tuple[str, ...]] = {
    "data.truncation": ("error", "left", "right", "middle"),
    f"{_ARR}.actor.loss_agg_mode": _LOSS_AGG,
    "critic.loss_agg_mode": _LOSS_AGG,
    "trainer.resume_mode": ("auto", "disable", "resume_path"),
    f"{_ARR}.actor.optim.lr_scheduler_type": ("constant", "cosine"),
    "critic.optim.lr_scheduler_type": ("constant", "cosine"),
    f"{_ARR}.actor.kl_loss_type": _KL,
    "algorithm.kl_penalty": _KL,
    "algorithm.kl_ctrl.type": names.KL_CONTROLLERS.names,
    f"{_ARR}.actor.strategy": _STRATEGIES,
    "critic.strategy": _STRATEGIES,
    f"{_ARR}.actor.policy_loss.flowrl.reward": ("group_norm", "raw"),
    f"{_ARR}.model.fused_kernel_options.impl_backend": ("torch", "triton"),
}
"""Keys whose value must be one of a fixed set (registry-backed keys are checked by their registry)."""

_GROUP_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline", "opo", "gpg", "grpo_passk")


def uses_ref(cfg: RLForgeConfig) -> bool:
    """Whether the run builds the reference policy: a KL term (``actor.use_kl_loss``,
    ``algorithm.use_kl_in_reward``) or a policy loss that asks for it (FlowRL's ``use_ref``)."""
    actor = cfg.actor_rollout_ref.actor
    mode = actor.policy_loss.loss_mode
    names.POLICY_LOSSES.check(mode)
    wants_ref = names.LOSSES_NEEDING_REF.get(mode)
    return bool(actor.use_kl_loss or cfg.algorithm.use_kl_in_reward or (wants_ref is not None and wants_ref(actor)))


def validate_config(cfg: RLForgeConfig) -> list[str]:
    """Check cross-field constraints; return warnings (one line each).

    Raises:
        ConfigError: a value outside its allowed set, a non-positive size, batch sizes that
            do not divide (the ranks' shares: :mod:`rlforge.config.sharding`), a bad ``trainer.device``, an offload/dtype/strategy combination
            that cannot work (:mod:`rlforge.config.precision`).
    """
    check_backends(cfg)  # hardware / backends rlforge cannot have: before any other check
    _check_choices(cfg)
    names.ADV_ESTIMATORS.check(cfg.algorithm.adv_estimator)
    names.POLICY_LOSSES.check(cfg.actor_rollout_ref.actor.policy_loss.loss_mode)
    names.REWARD_MANAGERS.check(cfg.reward_model.reward_manager)  # before any model loads
    check_ranges(cfg)
    check_model_len(cfg)
    check_token_budgets(cfg)
    _check_sizes(cfg)
    n = cfg.actor_rollout_ref.rollout.n
    actor = cfg.actor_rollout_ref.actor
    _check_batching(f"{_ARR}.actor", cfg.data.train_batch_size, actor.ppo_mini_batch_size,
                    actor.ppo_micro_batch_size, actor.ppo_micro_batch_size_per_gpu, n, actor.use_dynamic_bsz)
    if uses_critic(cfg):
        critic = cfg.critic
        _check_batching("critic", cfg.data.train_batch_size, critic.ppo_mini_batch_size,
                        critic.ppo_micro_batch_size, critic.ppo_micro_batch_size_per_gpu, n, critic.use_dynamic_bsz)
    skips_old_log_prob(cfg)  # recompute_old_log_prob=False on a batch that is not on-policy
    world = run_world(cfg)  # the launcher's WORLD_SIZE, else trainer.nnodes x trainer.n_gpus_per_node
    _check_megatron(cfg, world.size, world.source)  # the data-parallel sizes the sharding below divides by
    sharding = check_batch_sharding(cfg, world.size, world.source, uses_ref(cfg), uses_critic(cfg))
    gen = cfg.data.gen_batch_size
    if gen is not None and cfg.algorithm.filter_groups.enable and (gen <= 0 or (world.size > 1 and gen % world.size)):
        raise ConfigError(f"data.gen_batch_size={gen} must be positive and divisible by the {world.size} ranks "
                          f"({world.source}): each rank generates an equal share of every generation batch")
    check_device(cfg.trainer.device)
    if cfg.trainer.resume_mode == "resume_path" and not cfg.trainer.resume_from_path:
        raise ConfigError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<checkpoint folder>")
    if actor.clip_ratio_c <= 1.0:
        raise ConfigError(f"{_ARR}.actor.clip_ratio_c={actor.clip_ratio_c}: the dual-clip constant must be > 1.0")
    if cfg.algorithm.adv_estimator == "grpo_passk" and n < 2:
        raise ConfigError(f"algorithm.adv_estimator=grpo_passk needs a second-best response per prompt; "
                          f"set {_ARR}.rollout.n>=2")
    _check_policy_loss(cfg)
    _check_estimator_inputs(cfg)
    _check_rollout_correction(cfg)
    check_async_training(cfg)  # partial rollout (rlforge.config.async_training)
    _check_rollout_tp(cfg, world.size, world.source)
    lora = _check_lora(cfg)
    _check_multi_turn(cfg)
    check_model_reward(cfg)  # reward_model.enable / reward_model.judge.*
    precision = check_precision_and_offload(cfg, uses_ref(cfg), uses_critic(cfg))
    return split_batch_warnings(cfg, _warnings(cfg) + precision + _profile_step_warnings(cfg) + lora + sharding)


def _profile_step_warnings(cfg: RLForgeConfig) -> list[str]:
    """``trainer.profile_steps`` entries past ``trainer.total_training_steps`` never run."""
    t = cfg.trainer
    total = t.total_training_steps
    late = [s for s in (t.profile_steps or []) if total is not None and s > total]
    if not late:
        return []
    return [f"trainer.profile_steps={list(t.profile_steps)}: step(s) {late} come after "
            f"trainer.total_training_steps={total} and will not be profiled"]


def _check_rollout_tp(cfg: RLForgeConfig, world: int, source: str) -> None:
    """``rollout.name=native`` with a tensor-parallel size the user set: it must divide the processes (the
    heads are checked when the engine is built, :func:`rlforge.rollout.native.tensor_parallel.check_tp_size`)."""
    from rlforge.config.rollout_tp import KEY, rollout_tp_size

    tp = rollout_tp_size(cfg, world)
    if cfg.actor_rollout_ref.rollout.name == "native" and tp > 1 and world % tp:
        raise ConfigError(f"{KEY}={tp} does not divide the {world} process(es) of this run ({source}); "
                          "use a divisor of it, or 1 for one model copy per process")


def _check_megatron(cfg: RLForgeConfig, world: int, source: str) -> None:
    """``strategy=megatron``: the parallel sizes of each such role must fit the launched world
    (``world`` processes, counted from ``source``: the launcher's ``WORLD_SIZE``, else
    ``trainer.nnodes * trainer.n_gpus_per_node``); the model-dependent checks run when the
    engine is built (:func:`rlforge.engine.megatron.mesh.check_model_fits`)."""
    arr = cfg.actor_rollout_ref
    blocks = []
    if arr.actor.strategy == "megatron":
        blocks += [(f"{_ARR}.actor.megatron", arr.actor.megatron), (f"{_ARR}.ref.megatron", arr.ref.megatron)]
    if uses_critic(cfg) and cfg.critic.strategy == "megatron":
        blocks.append(("critic.megatron", cfg.critic.megatron))
    for key, block in blocks:
        tp, pp = int(block.tensor_model_parallel_size), int(block.pipeline_model_parallel_size)
        if tp >= 1 and pp >= 1 and world % (tp * pp):  # sizes below 1: parallel_dims names the key
            raise ConfigError(
                f"{key}.tensor_model_parallel_size={tp} x {key}.pipeline_model_parallel_size={pp} = {tp * pp} does "
                f"not divide the world size {world} ({source}); choose sizes whose product divides {world}"
            )
        parallel_dims(block, max(world, 1), key)


def _check_multi_turn(cfg: RLForgeConfig) -> None:
    """``rollout.multi_turn.*``: its keys, and its tool / interaction files (before any model loads)."""
    from rlforge.rollout.multi_turn.setup import check_multi_turn

    check_multi_turn(cfg)


def _check_lora(cfg: RLForgeConfig) -> list[str]:
    """The LoRA keys of the policy and the critic (:func:`rlforge.config.lora.check_lora_keys`);
    LoRA runs ``strategy=fsdp`` and ``strategy=megatron`` as ``fsdp2`` (a warning;
    :func:`rlforge.config.lora.lora_strategy`).  The model-dependent checks run when it is applied."""
    out: list[str] = []

    for node, model, strategy_key, strategy in (
        (f"{_ARR}.model", cfg.actor_rollout_ref.model, f"{_ARR}.actor.strategy", cfg.actor_rollout_ref.actor.strategy),
        ("critic.model", cfg.critic.model, "critic.strategy", cfg.critic.strategy),
    ):
        check_lora_keys(model, node)
        out += adapter_path_overrides(model, node)
        if lora_enabled(model) and strategy == "megatron" and (node != "critic.model" or uses_critic(cfg)):
            out.append(f"{strategy_key}=megatron with {node}.lora_rank={model.lora_rank}: LoRA is not built for "
                       f"tensor/pipeline parallelism yet; running {strategy_key}=fsdp2 (the model sharded over every "
                       "GPU; the megatron parallel sizes are not used)")
        if lora_enabled(model) and strategy == "fsdp" and (node != "critic.model" or uses_critic(cfg)):
            out.append(f"{strategy_key}=fsdp with {node}.lora_rank={model.lora_rank}: LoRA trains on the FSDP2 engine "
                       f"(FSDP1 cannot train the adapter beside the frozen base); running {strategy_key}=fsdp2")
    return out


def _check_policy_loss(cfg: RLForgeConfig) -> None:
    """Value checks of the settings read by the selected ``actor.policy_loss.loss_mode``."""
    actor = cfg.actor_rollout_ref.actor
    pl, key = actor.policy_loss, f"{_ARR}.actor.policy_loss"
    mode = pl.loss_mode
    if mode == "sapo" and (actor.tau_pos <= 0 or actor.tau_neg <= 0):
        raise ConfigError(f"{_ARR}.actor.tau_pos={actor.tau_pos} and {_ARR}.actor.tau_neg={actor.tau_neg}: "
                          "both SAPO temperatures must be > 0")
    if mode == "clip_cov" and pl.clip_cov_ratio <= 0:
        raise ConfigError(f"{key}.clip_cov_ratio={pl.clip_cov_ratio}: must be > 0 for loss_mode=clip_cov")
    if mode == "clip_cov" and pl.clip_cov_lb >= pl.clip_cov_ub:
        raise ConfigError(f"{key}.clip_cov_lb={pl.clip_cov_lb} must be < {key}.clip_cov_ub={pl.clip_cov_ub}")
    if mode == "kl_cov" and pl.kl_cov_ratio <= 0:
        raise ConfigError(f"{key}.kl_cov_ratio={pl.kl_cov_ratio}: must be > 0 for loss_mode=kl_cov")
    if mode == "dro" and (pl.dro_beta is None or pl.dro_beta <= 0):
        raise ConfigError(f"{key}.dro_beta={pl.dro_beta}: loss_mode=dro needs a positive quadratic-penalty "
                          "coefficient (verl's example: 0.05)")
    if mode == "flowrl":
        _check_flowrl(cfg)


def _check_estimator_inputs(cfg: RLForgeConfig) -> None:
    """The inputs that ``gdpo`` and the optimal-token-baseline estimators need are configured."""
    alg = cfg.algorithm
    if alg.adv_estimator in names.OTB_ESTIMATORS and not cfg.actor_rollout_ref.actor.calculate_sum_pi_squared:
        raise ConfigError(f"algorithm.adv_estimator={alg.adv_estimator} reads the old policy's sum of squared "
                          f"probabilities; set {_ARR}.actor.calculate_sum_pi_squared=true")
    if alg.adv_estimator != "gdpo":
        return
    if not alg.gdpo_reward_keys:
        raise ConfigError("algorithm.adv_estimator=gdpo needs algorithm.gdpo_reward_keys: the reward components the "
                          "reward function returns in its dict, e.g. '[accuracy_reward,format_reward]'")
    weights = alg.gdpo_reward_weights
    if weights is not None and len(weights) != len(alg.gdpo_reward_keys):
        raise ConfigError(f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(alg.gdpo_reward_keys)} "
                          "algorithm.gdpo_reward_keys; give one weight per key (or null for all 1)")


def _check_rollout_correction(cfg: RLForgeConfig) -> None:
    """``algorithm.rollout_correction``: its values, and the settings it cannot work with (the old
    log-probs' recompute is handled by :func:`~rlforge.trainer.on_policy.skips_old_log_prob`)."""
    rc, key = cfg.algorithm.rollout_correction, "algorithm.rollout_correction"
    check_rollout_correction(rc)
    if not rollout_correction_on(rc):
        return
    arr = cfg.actor_rollout_ref
    if arr.rollout.name == "hf":
        raise ConfigError(f"{key} needs the rollout's own log-probs, which {_ARR}.rollout.name=hf does not return; "
                          f"use {_ARR}.rollout.name=native")
    mode = arr.actor.policy_loss.loss_mode
    if rc.bypass_mode and mode != "vanilla":
        raise ConfigError(f"{key}.bypass_mode=true uses verl's bypass loss ({key}.loss_type=ppo_clip: PPO's clipped "
                          f"ratio, or reinforce), not {_ARR}.actor.policy_loss.loss_mode={mode}; set loss_mode=vanilla "
                          "or bypass_mode=false")
    if rc.bypass_mode and arr.actor.recompute_old_log_prob is True:
        raise ConfigError(f"{key}.bypass_mode=true takes the old log-probs from the rollout, but "
                          f"{_ARR}.actor.recompute_old_log_prob=true asks to recompute them; set one of them otherwise")
    if rc.rollout_is is not None and not rc.bypass_mode and mode == "flowrl":
        raise ConfigError(f"{key}.rollout_is={rc.rollout_is}: the flowrl loss does not take importance weights; "
                          f"set {key}.rollout_is=null (rejection, {key}.rollout_rs, still works)")


def _check_flowrl(cfg: RLForgeConfig) -> None:
    actor = cfg.actor_rollout_ref.actor
    f, key = actor.policy_loss.flowrl, f"{_ARR}.actor.policy_loss.flowrl"
    if f.beta < 0:
        raise ConfigError(f"{key}.beta={f.beta}: must be >= 0 (paper: 15)")
    if f.weight_clamp_max is not None and f.weight_clamp_max <= 0:
        raise ConfigError(f"{key}.weight_clamp_max={f.weight_clamp_max}: must be > 0, or null for no upper clamp")
    if f.weight_clamp_min is not None and f.weight_clamp_min < 0:
        raise ConfigError(f"{key}.weight_clamp_min={f.weight_clamp_min}: must be >= 0, or null for no lower clamp")
    if (f.weight_clamp_min is not None and f.weight_clamp_max is not None
            and f.weight_clamp_min >= f.weight_clamp_max):
        raise ConfigError(f"{key}.weight_clamp_min={f.weight_clamp_min} must be < "
                          f"{key}.weight_clamp_max={f.weight_clamp_max}")
    if f.log_z_hidden_size < 1:
        raise ConfigError(f"{key}.log_z_hidden_size={f.log_z_hidden_size}: must be >= 1")
    if f.log_z_lr_multiplier <= 0:
        raise ConfigError(f"{key}.log_z_lr_multiplier={f.log_z_lr_multiplier}: must be > 0")
    n = cfg.actor_rollout_ref.rollout.n
    micro = actor.ppo_micro_batch_size_per_gpu or actor.ppo_micro_batch_size
    if f.reward == "group_norm" and micro is not None and micro % n:
        raise ConfigError(
            f"{key}.reward=group_norm normalizes within each prompt's group, but "
            f"{_ARR}.actor.ppo_micro_batch_size_per_gpu={micro} splits groups of {_ARR}.rollout.n={n}; "
            f"use a multiple of {n} or set {key}.reward=raw"
        )


def _check_choices(cfg: RLForgeConfig) -> None:
    for key, allowed in CHOICES.items():
        value = get_key(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}; set {key} to one of them")


def _check_sizes(cfg: RLForgeConfig) -> None:
    arr = cfg.actor_rollout_ref
    positive: dict[str, Any] = {
        "data.train_batch_size": cfg.data.train_batch_size,
        "data.val_batch_size": cfg.data.val_batch_size,
        "data.max_prompt_length": cfg.data.max_prompt_length,
        "data.max_response_length": cfg.data.max_response_length,
        f"{_ARR}.actor.ppo_mini_batch_size": arr.actor.ppo_mini_batch_size,
        f"{_ARR}.actor.ppo_micro_batch_size": arr.actor.ppo_micro_batch_size,
        f"{_ARR}.actor.ppo_micro_batch_size_per_gpu": arr.actor.ppo_micro_batch_size_per_gpu,
        f"{_ARR}.actor.ppo_epochs": arr.actor.ppo_epochs,
        f"{_ARR}.rollout.n": arr.rollout.n,
        f"{_ARR}.rollout.val_kwargs.n": arr.rollout.val_kwargs.n,
        f"{_ARR}.rollout.log_prob_micro_batch_size_per_gpu": arr.rollout.log_prob_micro_batch_size_per_gpu,
        f"{_ARR}.ref.log_prob_micro_batch_size_per_gpu": arr.ref.log_prob_micro_batch_size_per_gpu,
        "trainer.total_training_steps": cfg.trainer.total_training_steps,
        "trainer.total_epochs": cfg.trainer.total_epochs,
        "data.builtin.train_size": cfg.data.builtin.train_size,
        "data.builtin.val_size": cfg.data.builtin.val_size,
    }
    for key, value in positive.items():
        if value is not None and value < 1:
            raise ConfigError(f"{key}={value}: must be >= 1 (or null where the key allows it)")
    _check_difficulty(cfg.data.builtin.difficulty)


def _check_difficulty(value: Any) -> None:
    """``data.builtin.difficulty``: a level >= 1, or a non-empty list of them (mixed in equal shares)."""
    levels = [value] if isinstance(value, int) else value
    ok = isinstance(levels, Sequence) and not isinstance(levels, str) and len(levels) > 0 and all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in levels)
    if not ok:
        raise ConfigError(f"data.builtin.difficulty={value!r}: give a level >= 1 (e.g. 2) or a non-empty list of "
                          "levels to mix (e.g. [1, 2])")


def _check_batching(role: str, train_bs: int, mini: int, micro_global: int | None, micro: int | None, n: int,
                    dynamic: bool = False) -> None:
    """Mini batches count prompts; micro batches count sequences (prompts x ``rollout.n``).
    With ``dynamic`` (``use_dynamic_bsz``) the micro batch size is not used, so, as in verl, it
    need not divide the mini batch (``config/later_work.py`` warns that it is ignored)."""
    if micro_global is not None and micro is not None:
        raise ConfigError(f"{role}.ppo_micro_batch_size and {role}.ppo_micro_batch_size_per_gpu are both set; "
                          f"set only {role}.ppo_micro_batch_size_per_gpu")
    if mini > train_bs:
        raise ConfigError(f"{role}.ppo_mini_batch_size={mini} is larger than data.train_batch_size={train_bs}; "
                          f"lower {role}.ppo_mini_batch_size or raise data.train_batch_size")
    if train_bs % mini:
        raise ConfigError(f"data.train_batch_size={train_bs} is not divisible by {role}.ppo_mini_batch_size={mini}; "
                          f"make data.train_batch_size a multiple of {role}.ppo_mini_batch_size")
    micro = micro if micro is not None else micro_global
    if micro is not None and not dynamic and (mini * n) % micro:
        raise ConfigError(
            f"{role}.ppo_mini_batch_size * {_ARR}.rollout.n = {mini} * {n} = {mini * n} sequences is not divisible by "
            f"{role}.ppo_micro_batch_size_per_gpu={micro}; pick a micro batch size that divides {mini * n}"
        )


def _warnings(cfg: RLForgeConfig) -> list[str]:
    out: list[str] = []
    n = cfg.actor_rollout_ref.rollout.n
    if cfg.algorithm.adv_estimator in _GROUP_ESTIMATORS and n == 1:
        out.append(f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} with {_ARR}.rollout.n=1: every group has one "
                   f"response, so there is no group baseline (the estimator's size-1 rule applies); "
                   f"set {_ARR}.rollout.n>=2")
    if cfg.algorithm.use_kl_in_reward and cfg.actor_rollout_ref.actor.use_kl_loss:
        out.append("algorithm.use_kl_in_reward and actor_rollout_ref.actor.use_kl_loss are both on: KL is penalised twice")
    for key in (f"{_ARR}.actor.ppo_micro_batch_size", "critic.ppo_micro_batch_size"):
        if get_key(cfg, key) is not None:
            out.append(f"{key} is deprecated; use {key}_per_gpu (as in verl, the global value is divided by the "
                       "data-parallel ranks)")
    return out + later_work_warnings(cfg)

"""The one table of keys that are accepted (verl compatibility) but not effective in this build.

This build generates in the training process (rlforge's ``native`` rollout or ``hf``).  A verl
command line may set vLLM, Megatron-LM, LoRA, Ray or profiler keys, or keys of the backend not
chosen; they are accepted and reported here with one warning line each, only when set to a value
that would matter.  When a feature lands, delete its row.  ``tests/config/test_no_silent_keys.py``
checks that every key of the schema is either read by a run or warned about here.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlforge.config import registry_names as names
from rlforge.config.actor import ActorConfig
from rlforge.config.algorithm import AlgorithmConfig, PFPPOConfig
from rlforge.config.common import (
    CheckpointConfig,
    FSDPConfig,
    MegatronConfig,
    OptimConfig,
    get_key,
    hf_model_only,
)
from rlforge.config.critic import CriticConfig
from rlforge.config.data import CustomClsConfig, DataConfig, DatagenConfig, SamplerConfig
from rlforge.config.profiler import RoleProfilerConfig, follower_profiler
from rlforge.config.reward import RewardModelConfig, RewardModelModelConfig, SandboxFusionConfig
from rlforge.config.rollout import (
    VERL_ROLLOUTS,
    AgentLoopConfig,
    EngineKwargsConfig,
    MultiTurnSchema,
    RolloutConfig,
    TraceConfig,
)
from rlforge.config.root import RLForgeConfig, uses_critic
from rlforge.config.trainer import TrainerConfig
from rlforge.config.user_keys import user_set, verl_values
from rlforge.config.verl_keys import verl_only_warnings
from rlforge.errors import ConfigError

SUPPORTED_LOGGERS = ("console", "file", "tensorboard", "wandb", "mlflow")
"""``trainer.logger`` entries this build runs (wandb and mlflow when their package is installed)."""

VERL_LOGGERS = ("swanlab", "vemlp_wandb", "clearml", "trackio")
"""verl's other loggers: accepted with a warning and skipped; any other name is an error."""


@dataclass(frozen=True)
class LaterWork:
    """One accepted-but-not-effective key.

    Attributes:
        key: dotted config key (or a label for a combination, with ``value_of`` set).
        matters: True when the value would change behaviour if the feature existed.
        message: warning text; ``{key}`` and ``{value}`` are filled in.
        value_of: computes the value from the config; None = read ``key``.
    """

    key: str
    matters: Callable[[Any], bool]
    message: str
    value_of: Callable[[Any], Any] | None = None


def _liger_available() -> bool:
    """Imports torch: asked only when ``model.use_liger=True``."""
    from rlforge.engine.liger import liger_available

    return liger_available()


def _reward_kwargs_left(cfg: Any) -> dict[str, Any]:
    """``reward_model.reward_kwargs`` less DAPO's ``max_resp_len`` where it equals ``data.max_response_length``
    (what rlforge's over-long penalty uses as its L_max: nothing is lost)."""
    kw = dict(cfg.reward_model.reward_kwargs or {})
    if kw.get("max_resp_len") == cfg.data.max_response_length:
        kw.pop("max_resp_len")
    return kw


def rollout_tp_honoured(cfg: Any) -> bool:
    from rlforge.config.rollout_tp import honoured

    return honoured(cfg)


_NOT_HERE = "{key}={value} is not available in this single-process build; ignored"


MEGATRON_IMPLEMENTED = ("tensor_model_parallel_size", "pipeline_model_parallel_size",
                        "virtual_pipeline_model_parallel_size", "sequence_parallel", "param_offload",
                        "optimizer_offload", "dtype")
"""``megatron.*`` fields that ``strategy=megatron`` (PyTorch TP/PP/FSDP2) implements."""

_MEGATRON_LATER = ("{key}={value} is not implemented by strategy=megatron (PyTorch tensor/pipeline parallelism "
                   "and FSDP2, not Megatron-LM); ignored")


def _megatron_rows(node: str, strategy_key: str) -> list[LaterWork]:
    """One row per field of the ``megatron`` block at ``node``: the implemented ones warn when
    set while ``strategy_key`` is not ``megatron``; the others whenever they differ from the default."""
    rows: list[LaterWork] = []
    default = MegatronConfig()
    for f in dataclasses.fields(MegatronConfig):
        d = getattr(default, f.name)
        key = f"{node}.{f.name}"
        if f.name in MEGATRON_IMPLEMENTED:
            rows.append(LaterWork(
                key, lambda v, d=d: v[0] != "megatron" and v[1] != d,
                "{key}={value[1]} only applies with " + strategy_key + "=megatron; ignored",
                lambda c, k=key: (get_key(c, strategy_key), get_key(c, k))))
        else:
            rows.append(LaterWork(key, lambda v, d=d: v != d, _MEGATRON_LATER))
    return rows


def _default(cls: type, name: str) -> Any:
    """The schema default of field ``name`` of dataclass ``cls`` (defaults live only there)."""
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _unless_default(node: str, cls: type, names: tuple[str, ...], message: str) -> list[LaterWork]:
    """One row per field ``names`` of ``cls`` at ``node``, warning whenever it differs from its default."""
    return [LaterWork(f"{node}.{n}", lambda v, d=_default(cls, n): v != d, message) for n in names]


def _follows(key: str, parent: str, message: str, matters: Callable[[Any], bool] = lambda v: v[0] != v[1]) -> LaterWork:
    """A key whose default is ``${parent}`` and whose own value is not read (``parent``'s is):
    warn when the two differ; ``{value[0]}`` is the key's value, ``{value[1]}`` the parent's."""
    return LaterWork(key, matters, message, lambda c: (get_key(c, key), get_key(c, parent)))


_FSDP_REFUSED_UNDER_MEGATRON = ("param_offload", "optimizer_offload", "offload_policy", "model_dtype", "mixed_precision")
"""``fsdp_config`` fields that :mod:`rlforge.config.precision` refuses under ``strategy=megatron``
(naming the ``megatron.*`` key to set instead), so they need no row here."""

_FSDP_FIELDS = ("wrap_policy.min_num_params", *(f.name for f in dataclasses.fields(FSDPConfig)
                                               if f.name not in ("wrap_policy", *_FSDP_REFUSED_UNDER_MEGATRON)))


def _fsdp_rows(node: str, strategy_key: str) -> list[LaterWork]:
    """The ``fsdp_config`` block at ``node``: ignored by ``strategy=megatron`` (which reads the
    ``megatron`` block); ``wrap_policy.min_num_params`` is FSDP1's (FSDP2 shards per decoder layer)."""
    rows: list[LaterWork] = []
    for name in _FSDP_FIELDS:
        d = FSDPConfig()
        for part in name.split("."):
            d = getattr(d, part)
        key = f"{node}.{name}"
        fsdp1_only = name == "wrap_policy.min_num_params"
        rows.append(LaterWork(
            key, lambda v, d=d, only=fsdp1_only: v[1] != d and (v[0] == "megatron" or (only and v[0] == "fsdp2")),
            "{key}={value[1]} does not apply with " + strategy_key + "={value[0]} ("
            + ("FSDP1's size-based wrapping; FSDP2 and megatron shard per decoder layer" if fsdp1_only
               else "strategy=megatron reads the role's megatron block") + "); ignored",
            lambda c, k=key: (get_key(c, strategy_key), get_key(c, k))))
    return rows


def _model_rows(node: str, role: str) -> list[LaterWork]:
    """Loading keys of the model block at ``node``; ``role`` names it in messages.  (Its LoRA keys
    take effect: :mod:`rlforge.models.lora`, checked by ``validate._check_lora``.)"""
    return [
        LaterWork(f"{node}.use_shm", lambda v: v is True, "{key}=True: the " + role + " weights are read straight from "
                  "their files; ignored"),
    ]


def _optim_rows(node: str) -> list[LaterWork]:
    return [
        LaterWork(f"{node}.total_training_steps", lambda v: v != -1,
                  "{key}={value}: the LR schedule spans the run's steps (trainer.total_training_steps, else "
                  "trainer.total_epochs x batches per epoch); ignored"),
        *_unless_default(node, OptimConfig, ("optimizer", "optimizer_impl"),
                         "{key}={value}: only torch.optim.AdamW is available in this build; using AdamW"),
        LaterWork(f"{node}.override_optimizer_config", lambda v: bool(v),
                  "{key}={value}: extra optimizer arguments are not passed in this build; using AdamW(lr, betas, "
                  "weight_decay)"),
    ]


def _checkpoint_rows(node: str, everything: bool) -> list[LaterWork]:
    """``everything``: the role's checkpoint always holds all parts (the critic); else only
    ``hf_model`` is optional (the actor)."""
    parts = _default(CheckpointConfig, "save_contents")
    save = (LaterWork(f"{node}.save_contents", lambda v, d=parts: v != d,
                      "{key}={value}: the critic's checkpoint always holds model, optimizer and extra; ignored")
            if everything else
            LaterWork(f"{node}.save_contents", lambda v, d=parts: not set(d) <= set(v) and not hf_model_only(v),
                      "{key}={value}: a checkpoint always holds model, optimizer and extra (scheduler, RNG) in this "
                      "build; only hf_model is optional ([hf_model] alone saves only the Hugging Face folder); "
                      "saving all of them"))
    return [
        save,
        _follows(f"{node}.load_contents", f"{node}.save_contents",
                 "{key}={value[0]}: resuming restores every part the checkpoint holds; ignored"),
    ]


_VERL_PROFILER = ("verl's per-role profiler settings are not read; rlforge's torch.profiler recording "
                  "(global_profiler.tool=torch with global_profiler.steps, or trainer.profile_steps) covers every "
                  "role of the step, and trainer.profile traces its stages")
_ENTROPY = ("{key}=True is not implemented; actor_rollout_ref.model.use_fused_kernels=true (the default) computes "
            "entropy chunk by chunk in the LM head and recomputes each chunk in backward; ignored")
_NATIVE_ONLY = ("ignore_eos", "max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "free_cache_engine",
                "cudagraph_capture_sizes")
"""``rollout.*`` fields that only the native engine reads (``hf`` runs transformers' ``generate``)."""


def _native_only_rows(node: str) -> list[LaterWork]:
    return [LaterWork(f"{node}.{n}", lambda v, d=_default(RolloutConfig, n): v[0] == "hf" and v[1] != d,
                      "{key}={value[1]} only applies to the native rollout (rollout.name=native); ignored by hf",
                      lambda c, k=f"{node}.{n}": (get_key(c, f"{node}.name"), get_key(c, k)))
            for n in _NATIVE_ONLY]


_ARR = "actor_rollout_ref"


def _changed_leaves(value: Any, default: Any, prefix: str, cfg: Any, parent: Any = None) -> list[str]:
    """Dotted keys under ``prefix`` whose value differs from the schema default.  A default that is an
    interpolation (``${actor_rollout_ref.actor.ppo_epochs}``, or ``${.sibling}``) is compared with the value
    it points at in ``cfg``, so a key that only follows another one is not reported."""
    if dataclasses.is_dataclass(default):
        return [k for f in dataclasses.fields(default)
                for k in _changed_leaves(getattr(value, f.name), getattr(default, f.name), f"{prefix}.{f.name}",
                                         cfg, value)]
    if isinstance(default, str) and default.startswith("${") and default.endswith("}"):
        ref = default[2:-1]
        if ref.startswith("oc.select:"):  # ${oc.select:key,fallback}: the key it follows
            ref = ref.removeprefix("oc.select:").partition(",")[0].strip()
        try:
            default = getattr(parent, ref[1:]) if ref.startswith(".") else get_key(cfg, ref)
        except (AttributeError, KeyError):
            return []
        if dataclasses.is_dataclass(default) and dataclasses.is_dataclass(value):  # a block that follows another
            return _changed_leaves(value, default, prefix, cfg, parent)
    plain = list(value) if isinstance(value, list | tuple) else value
    return [] if plain == (list(default) if isinstance(default, list | tuple) else default) else [prefix]


def _block_row(node: str, default: Any, why: str, when: Callable[[Any], bool] = lambda c: True,
               skip: tuple[str, ...] = ()) -> LaterWork:
    """One row for the typed verl block at ``node``: ``key=value`` of each of its leaves that differs from
    ``default`` (an instance of the block's dataclass; an interpolated default is compared with what it
    follows), while ``when(cfg)``; ``skip``: leaf names left to other rows."""
    def changed(c: Any) -> list[str]:
        if not when(c):
            return []
        keys = _changed_leaves(get_key(c, node), default, node, c)
        return [f"{k}={get_key(c, k)}" for k in keys if k.rpartition(".")[2] not in skip]

    return LaterWork(node, bool, "{value_list}: " + why + "; ignored", changed)


def _kl_reward_keys_unused(c: Any) -> list[str]:
    """``algorithm.kl_ctrl.*`` / ``algorithm.kl_penalty`` set away from their defaults with the in-reward KL off."""
    if c.algorithm.use_kl_in_reward:
        return []
    keys = _changed_leaves(c.algorithm.kl_ctrl, AlgorithmConfig().kl_ctrl, "algorithm.kl_ctrl", c)
    keys += ["algorithm.kl_penalty"] if c.algorithm.kl_penalty != AlgorithmConfig().kl_penalty else []
    return [f"{k}={get_key(c, k)}" for k in keys]


def _critic_keys_without_critic(c: Any) -> list[str]:
    """The ``critic.*`` keys set away from their defaults in a run that trains no critic."""
    if uses_critic(c):
        return []
    return [k for k in _changed_leaves(c.critic, CriticConfig(), "critic", c) if k != "critic.enable"]


def _mt(c: Any) -> dict[str, Any]:
    mt = c.actor_rollout_ref.rollout.multi_turn
    return dataclasses.asdict(mt) if dataclasses.is_dataclass(mt) else dict(mt or {})


def _model_reward_on(c: Any) -> bool:
    return bool(c.reward_model.enable or c.reward_model.judge.enable)


_DYNAMIC_MICRO = (
    (f"{_ARR}.actor", "ppo_micro_batch_size", "use_dynamic_bsz"),
    (f"{_ARR}.rollout", "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz"),
    (f"{_ARR}.ref", "log_prob_micro_batch_size", "log_prob_use_dynamic_bsz"),
    ("critic", "ppo_micro_batch_size", "use_dynamic_bsz"),
)
"""(node, micro-batch key stem, its dynamic-batching switch): with the switch on, the node's
``*_max_token_len_per_gpu`` token budget replaces the micro-batch size, as in verl."""


def _unused_micro_sizes(c: Any) -> list[str]:
    """``key=value`` of each micro-batch size that a token budget replaces (one warning line for all)."""
    out = []
    for node, stem, switch in _DYNAMIC_MICRO:
        if not get_key(c, f"{node}.{switch}"):
            continue
        for key in (f"{node}.{stem}_per_gpu", f"{node}.{stem}"):
            value = get_key(c, key)
            if value is not None:
                out.append(f"{key}={value}")
    return out


def _reward_model_rows() -> list[LaterWork]:
    """Keys of ``reward_model`` that the reward model (a plain forward-only module per process,
    :mod:`rlforge.rewards.reward_model`) does not read: warned while a reward model or judge is on."""
    def on(key: str, matters: Callable[[Any], bool], why: str) -> LaterWork:
        return LaterWork(key, lambda v: v[0] and matters(v[1]), "{key}={value[1]}: " + why + "; ignored",
                         lambda c, k=key: (_model_reward_on(c), get_key(c, k)))

    plain = "the reward model runs as one plain forward-only module per process"
    rows = [
        on("reward_model.strategy", lambda v, d=_default(RewardModelConfig, "strategy"): v != d, plain),
        on("reward_model.ulysses_sequence_parallel_size", lambda v: v > 1, plain),
        on("reward_model.model.use_shm", lambda v: v is True, "the reward model is read from its files"),
        on("reward_model.model.use_remove_padding", lambda v: v is True, plain + " on padded rows"),
        on("reward_model.model.external_lib", lambda v: v is not None,
           "only architectures that transformers ships load"),
        LaterWork("reward_model.model.use_fused_kernels", lambda v: v[0] and v[1] != v[2],
                  "{key}={value[1]}: the reward model has no LM head to fuse; ignored",
                  lambda c: (_model_reward_on(c), c.reward_model.model.use_fused_kernels,
                             c.actor_rollout_ref.model.use_fused_kernels)),
        LaterWork("reward_model.model.input_tokenizer", lambda v: v[0] and v[1] is not None and v[1] != v[2],
                  "{key}={value[1]}: responses are decoded with the policy's tokenizer (actor_rollout_ref.model); "
                  "only null (the reward model reads the policy's ids) changes what happens; ignored",
                  lambda c: (c.reward_model.enable, c.reward_model.model.input_tokenizer,
                             c.actor_rollout_ref.model.path)),
        # combine=override (verl): the rule / custom function and its overlong penalty are not called
        LaterWork("custom_reward_function.path", lambda v: v[0] and v[1] == "override" and v[2] is not None,
                  "{key}={value[2]}: with a reward model or judge and reward_model.combine=override (verl's "
                  "behaviour) the model score replaces the function's; set reward_model.combine=sum to add them",
                  lambda c: (_model_reward_on(c), c.reward_model.combine, c.custom_reward_function.path)),
        LaterWork("reward_model.overlong_buffer.enable", lambda v: v[0] and v[1] == "override" and v[2] is True,
                  "{key}=True: with a reward model or judge and reward_model.combine=override (verl's behaviour) "
                  "the model score is used as it is, without the overlong penalty; set reward_model.combine=sum",
                  lambda c: (_model_reward_on(c), c.reward_model.combine, c.reward_model.overlong_buffer.enable)),
    ]
    default = _default(RewardModelModelConfig, "fsdp_config")
    for name in ("wrap_policy.min_num_params", *(f.name for f in dataclasses.fields(FSDPConfig)
                                                  if f.name != "wrap_policy")):
        d = default
        for part in name.split("."):
            d = getattr(d, part)
        rows.append(on(f"reward_model.model.fsdp_config.{name}", lambda v, d=d: v != d, plain + " (no FSDP)"))
    return rows


_NO_DUMP = "{key}={value}: dumping generations is not available in this build yet; ignored"


def _rc(c: Any) -> Any:
    return c.algorithm.rollout_correction


_RC = "algorithm.rollout_correction"
_RC_ROWS = (  # keys that only one mode of rollout correction reads (verl ignores them the same way)
    LaterWork(f"{_RC}.rollout_is_threshold", lambda v: v[0] not in (2.0, None) and v[1] is None,
              "{key}={value[0]} bounds the importance weights, but " + _RC + ".rollout_is is null; ignored",
              lambda c: (_rc(c).rollout_is_threshold, _rc(c).rollout_is)),
    LaterWork(f"{_RC}.rollout_is_batch_normalize", lambda v: v[0] is True and v[1] is None,
              "{key}=True normalizes the importance weights, but " + _RC + ".rollout_is is null; ignored",
              lambda c: (_rc(c).rollout_is_batch_normalize, _rc(c).rollout_is)),
    LaterWork(f"{_RC}.rollout_rs_threshold", lambda v: v[0] is not None and v[1] is None,
              "{key}={value[0]} is the rejection threshold, but " + _RC + ".rollout_rs is null; ignored",
              lambda c: (_rc(c).rollout_rs_threshold, _rc(c).rollout_rs)),
    LaterWork(f"{_RC}.loss_type", lambda v: v[0] != "ppo_clip" and not v[1],
              "{key}={value[0]} only applies with " + _RC + ".bypass_mode=true; the configured policy loss "
              "(actor.policy_loss.loss_mode) runs; ignored",
              lambda c: (_rc(c).loss_type, _rc(c).bypass_mode)),
)


def _data_rows() -> list[LaterWork]:
    """``data.*`` keys of verl's ``RLHFDataset`` that rlforge's dataset (tokenized once, up front, in the
    training process) has no use for."""
    up_front = "prompts are read and tokenized once, up front, in the training process"
    return [
        LaterWork("data.tokenizer", lambda v: v is not None,
                  "{key}={value}: prompts are tokenized with the policy's tokenizer (actor_rollout_ref.model."
                  "tokenizer_path, else actor_rollout_ref.model.path), as in verl; ignored"),
        LaterWork("data.use_shm", lambda v: v is True, "{key}=True: " + up_front + "; ignored"),
        LaterWork("data.gen_batch_size", lambda v: v[0] is not None and not v[1] and v[0] != v[2],
                  "{key}={value[0]} sizes DAPO's generation batches, which only dynamic sampling "
                  "(algorithm.filter_groups.enable=true) draws; without it each step generates and trains on "
                  "data.train_batch_size={value[2]} prompts (verl's DAPO trainer would train on all {value[0]}); "
                  "ignored",
                  lambda c: (c.data.gen_batch_size, c.algorithm.filter_groups.enable, c.data.train_batch_size)),
        LaterWork("data.dataloader_num_workers", lambda v, d=_default(DataConfig, "dataloader_num_workers"): v != d,
                  "{key}={value}: " + up_front + " (no DataLoader workers); ignored"),
        LaterWork("data.filter_overlong_prompts_workers", lambda v: v != 1,
                  "{key}={value}: data.filter_overlong_prompts measures each prompt while it is tokenized, in the "
                  "training process (no worker pool); ignored"),
        LaterWork("data.tool_config_path", lambda v: v is not None,
                  "{key}={value}: the tool schemas rendered into the prompts (and so counted in their length) are "
                  "those of actor_rollout_ref.rollout.multi_turn.tool_config_path; ignored"),
        LaterWork("data.return_raw_chat", lambda v: v is True,
                  "{key}=True: rlforge always keeps each prompt's chat messages in the batch (non-tensor "
                  "'raw_prompt', read by the multi-turn rollout and the reward model); nothing changes"),
        LaterWork("data.return_raw_input_ids", lambda v: v is True,
                  "{key}=True: a reward model with another tokenizer re-renders the raw chat itself "
                  "(reward_model.model.input_tokenizer); no raw ids are kept; ignored"),
        LaterWork("data.return_full_prompt", lambda v: v is True,
                  "{key}=True: the templated prompt text is not kept in the batch (nothing in rlforge reads it); "
                  "ignored"),
        *_unless_default("data", DataConfig, ("image_key", "video_key"),
                         "{key}={value}: multi-modal data is not supported in this build; the column is not read"),
        LaterWork("data.return_multi_modal_inputs", lambda v: v is False,
                  "{key}=False: multi-modal data is not supported in this build; ignored"),
        LaterWork("data.trust_remote_code", lambda v: v is True,
                  "{key}=True: tokenizer code from the repository is not run in this build; ignored"),
        *_unless_default("data.custom_cls", CustomClsConfig, ("path", "name"),
                         "{key}={value}: a user dataset class is not loaded in this build; rlforge's dataset reads "
                         "verl's parquet/jsonl columns; ignored"),
        _block_row("data.sampler", SamplerConfig(), "a curriculum sampler is not loaded in this build; the "
                   "training set is shuffled each epoch (data.shuffle, data.seed)"),
        _block_row("data.datagen", DatagenConfig(), "dynamic data generation is not available in this build"),
    ]


def _global_profiler_rows() -> list[LaterWork]:
    """One row per verl ``global_profiler`` key (:mod:`rlforge.perf.verl_profiler` maps ``tool=torch``,
    ``steps`` and ``save_path`` onto the torch.profiler recording), plus one for keys verl does not have."""
    def warning(c: Any, name: str) -> str:
        from rlforge.perf.verl_profiler import global_profiler_warning

        return global_profiler_warning(c.global_profiler, name)

    from rlforge.perf.verl_profiler import KNOWN_KEYS

    return [LaterWork(f"global_profiler.{n}" if n else "global_profiler", bool, "{value}",
                      lambda c, n=n: warning(c, n)) for n in (*KNOWN_KEYS, "")]


def _ray_settings(value: Any) -> bool:
    """Whether a free-form Ray block holds a value (verl's defaults are nulls)."""
    if isinstance(value, dict):
        return any(_ray_settings(v) for v in value.values())
    return value is not None


_NO_RAY = "{key}={value}: a Ray setting; rlforge runs without Ray (rlforge train starts its own processes); ignored"

LATER_WORK: tuple[LaterWork, ...] = (
    LaterWork(f"{_ARR}.actor.calculate_sum_pi_squared", lambda v: v[0] and v[1] not in names.OTB_ESTIMATORS,
              "{key}=True with algorithm.adv_estimator={value[1]}: the old_log_prob stage computes the sum of squared "
              "probabilities, but only the optimal-token-baseline estimators read it (verl's variance_proxy/* "
              "metrics are not logged in this build)",
              lambda c: (c.actor_rollout_ref.actor.calculate_sum_pi_squared, c.algorithm.adv_estimator)),
    *(LaterWork(f"algorithm.{k}", lambda v: v[0] is not None and v[1] != "gdpo",
                "{key}={value[0]}: only algorithm.adv_estimator=gdpo reads it (got {value[1]}); ignored",
                lambda c, k=k: (getattr(c.algorithm, k), c.algorithm.adv_estimator))
      for k in ("gdpo_reward_keys", "gdpo_reward_weights")),
    *_RC_ROWS,
    LaterWork(f"{_ARR}.actor.use_prefix_grouper", lambda v: v[0] and (not v[1] or v[2] == "megatron"),
              "{key}=True needs the padding-free forward (actor_rollout_ref.model.use_remove_padding=true) on the "
              "FSDP or local engine; got use_remove_padding={value[1]}, strategy={value[2]}; ignored",
              lambda c: (c.actor_rollout_ref.actor.use_prefix_grouper, c.actor_rollout_ref.model.use_remove_padding,
                         c.actor_rollout_ref.actor.strategy)),
    LaterWork(f"{_ARR}.rollout.name", lambda v: v in VERL_ROLLOUTS,
              "{key}={value} is not available in this build; running rlforge's native engine instead "
              "(hf where the model is not Llama/Qwen-family)"),
    LaterWork(f"{_ARR}.rollout.tensor_model_parallel_size", lambda v: v[0] != "native" and v[1] > 1 and not v[2],
              "{key}={value[1]}: runs as 1, one model copy per process; rlforge's rollout is tensor parallel at a "
              "size you set that divides the number of processes",
              lambda c: (c.actor_rollout_ref.rollout.name, c.actor_rollout_ref.rollout.tensor_model_parallel_size,
                         rollout_tp_honoured(c))),
    LaterWork(f"{_ARR}.rollout.gpu_memory_utilization", lambda v: v[0] == "hf" and v[1] != 0.5,
              "{key}={value[1]} only applies to the native rollout (rollout.name=native); ignored by hf",
              lambda c: (c.actor_rollout_ref.rollout.name, c.actor_rollout_ref.rollout.gpu_memory_utilization)),
    LaterWork(f"{_ARR}.rollout.calculate_log_probs", lambda v: v[0] == "hf" and v[1],
              "{key}=True only applies to the native rollout; ignored by hf",
              lambda c: (c.actor_rollout_ref.rollout.name, c.actor_rollout_ref.rollout.calculate_log_probs)),
    LaterWork(f"{_ARR}.rollout.enforce_eager", lambda v: v[0] == "hf" and v[1],
              "{key}=True only applies to the native rollout's CUDA graphs; ignored by hf",
              lambda c: (c.actor_rollout_ref.rollout.name, c.actor_rollout_ref.rollout.enforce_eager)),
    LaterWork(f"{_ARR}.rollout.response_length", lambda v: v[0] != v[1],
              "{key}={value[0]}: responses are data.max_response_length={value[1]} tokens long in this build "
              "(set that key instead); ignored",
              lambda c: (c.actor_rollout_ref.rollout.response_length, c.data.max_response_length)),
    LaterWork(f"{_ARR}.rollout.prompt_length", lambda v: v[0] != v[1],
              "{key}={value[0]}: prompts are cut to data.max_prompt_length={value[1]} tokens in this build "
              "(set that key instead); ignored",
              lambda c: (c.actor_rollout_ref.rollout.prompt_length, c.data.max_prompt_length)),
    LaterWork(f"{_ARR}.rollout.dtype", lambda v: v != "bfloat16",
              "{key}={value}: the rollout computes in the trainer's dtype (bfloat16 autocast on a GPU, float32 on "
              "CPU); ignored"),
    LaterWork(f"{_ARR}.rollout.enable_chunked_prefill", lambda v: v is False,
              "{key}=False: the native engine always prefills in chunks of rollout.max_num_batched_tokens; ignored"),
    LaterWork(f"{_ARR}.rollout.over_sample_rate", lambda v: v != 0, _NOT_HERE),
    LaterWork(f"{_ARR}.rollout.multi_stage_wake_up", lambda v: v is True,
              "{key}=True: the native engine wakes in one stage (KV cache and graphs), timed as rollout/wake_s; "
              "ignored"),
    LaterWork(f"{_ARR}.hybrid_engine", lambda v: v is False, "{key}=False is not available; actor and rollout share one process"),
    LaterWork(f"{_ARR}.model.use_remove_padding", lambda v: v[0] and v[1] == "megatron",
              "{key}=True has no effect with strategy=megatron (pipeline micro-batches are padded to one shape); "
              "using padded forwards", lambda c: (c.actor_rollout_ref.model.use_remove_padding,
                                                  c.actor_rollout_ref.actor.strategy)),
    LaterWork(f"{_ARR}.actor.ulysses_sequence_parallel_size", lambda v: v > 1, _NOT_HERE),
    LaterWork("critic.ulysses_sequence_parallel_size", lambda v: v > 1, _NOT_HERE),
    LaterWork(f"{_ARR}.model.use_liger", lambda v: v[0] is True and not v[1],
              "{key}=True needs liger-kernel and a CUDA GPU (pip install liger-kernel); using the eager modules",
              lambda c: (c.actor_rollout_ref.model.use_liger,
                         c.actor_rollout_ref.model.use_liger is True and _liger_available())),
    LaterWork("use_dynamic_bsz micro-batch sizes", bool,
              "{value_list}: no effect with use_dynamic_bsz / log_prob_use_dynamic_bsz on, which pack "
              "micro-batches to the *_max_token_len_per_gpu token budgets instead (as verl does); ignored",
              _unused_micro_sizes),
    *_reward_model_rows(),
    LaterWork("custom_reward_function.reward_kwargs", lambda v: bool(v[0]) and not v[1],
              "{key} is passed to the function of custom_reward_function.path, which is not set "
              "(the built-in rules take no extra keywords); ignored",
              lambda c: (c.custom_reward_function.reward_kwargs, c.custom_reward_function.path)),
    *[LaterWork(f"async_training.{k}", lambda v: not v[0] and v[1] != v[2],
                "{key}={value[1]} only applies with async_training.partial_rollout=true; ignored",
                lambda c, k=k, d=d: (c.async_training.partial_rollout, getattr(c.async_training, k), d))
      for k, d in (("staleness_threshold", 0.0), ("max_version_gap", None), ("stale_mode", "mask"))],
    LaterWork("reward_model.reward_kwargs", lambda v: bool(v),
              "{key}={value}: rlforge's reward managers take no constructor keywords (use "
              "custom_reward_function.reward_kwargs for the function; DAPO's overlong_buffer_cfg is mapped onto the "
              "over-long penalty keys, and its max_resp_len is data.max_response_length); ignored",
              lambda c: _reward_kwargs_left(c)),
    LaterWork("reward_model.num_workers", lambda v: v[0] != 0 and v[1] != "prime",
              "{key}={value[0]} only sizes the process pool of reward_model.reward_manager=prime "
              "(this run uses {value[1]}); ignored",
              lambda c: (c.reward_model.num_workers, c.reward_model.reward_manager)),
    *_megatron_rows(f"{_ARR}.actor.megatron", f"{_ARR}.actor.strategy"),
    *_megatron_rows(f"{_ARR}.ref.megatron", f"{_ARR}.actor.strategy"),  # the reference runs on the actor's engine
    *_megatron_rows("critic.megatron", "critic.strategy"),
    *_fsdp_rows(f"{_ARR}.actor.fsdp_config", f"{_ARR}.actor.strategy"),
    *_fsdp_rows(f"{_ARR}.ref.fsdp_config", f"{_ARR}.actor.strategy"),
    *_fsdp_rows("critic.model.fsdp_config", "critic.strategy"),
    LaterWork(f"{_ARR}.ref.fsdp_config.optimizer_offload", lambda v: v is True,
              "{key}=True: the reference policy has no optimizer; ignored"),
    *[LaterWork(f"algorithm.{k}", lambda v, r=readers: v[0] != v[1] and v[2] in names.ADV_ESTIMATORS.names and v[2] not in r,
                "{key}={value[0]} is read only by algorithm.adv_estimator=" + " / ".join(readers)
                + " (this run: {value[2]}); ignored",
                lambda c, k=k, d=d: (getattr(c.algorithm, k), d, c.algorithm.adv_estimator))
      for k, d, readers in (("gamma", 1.0, ("gae", "reinforce_plus_plus")), ("lam", 1.0, ("gae",)))],
    *[LaterWork(f"{_ARR}.actor.{k}", lambda v: not v[0] and v[1] != v[2],
                "{key}={value[1]} only applies with actor_rollout_ref.actor.use_kl_loss=true; ignored",
                lambda c, k=k: (c.actor_rollout_ref.actor.use_kl_loss, getattr(c.actor_rollout_ref.actor, k),
                                getattr(ActorConfig(), k)))
      for k in ("kl_loss_coef", "kl_loss_type")],
    LaterWork("algorithm.kl_ctrl", bool, "{value_list}: only applies with algorithm.use_kl_in_reward=true; ignored",
              _kl_reward_keys_unused),
    LaterWork("critic", bool,
              "{value_list}: this run trains no critic (critic.enable, or algorithm.adv_estimator=gae, turns one "
              "on); ignored", _critic_keys_without_critic),
    LaterWork(f"{_ARR}.rollout.multi_turn.enable", lambda v: v[0] is True and not v[1] and not v[2],
              "{key}=True without multi_turn.tool_config_path or multi_turn.interaction_config_path: there is no "
              "tool or user turn to add, so every response is one assistant turn, as without multi_turn",
              lambda c: (_mt(c).get("enable"), _mt(c).get("tool_config_path"), _mt(c).get("interaction_config_path"))),
    # model
    *_model_rows(f"{_ARR}.model", "policy's"),
    *_model_rows("critic.model", "critic's"),
    LaterWork(f"{_ARR}.model.custom_chat_template", lambda v: v is not None,
              "{key} is not applied in this build yet; prompts use the tokenizer's own chat template"),
    LaterWork(f"{_ARR}.model.external_lib", lambda v: v is not None,
              "{key}={value} is not imported in this build yet; only architectures that transformers ships load"),
    LaterWork(f"{_ARR}.model.trust_remote_code", lambda v: v is True,
              "{key}=True: model code from the repository is not run in this build; only architectures that "
              "transformers ships load"),
    _follows("critic.model.external_lib", f"{_ARR}.model.external_lib",
             "{key}={value[0]} is not imported in this build yet; only architectures that transformers ships load",
             lambda v: v[0] is not None and v[0] != v[1]),
    _follows("critic.model.trust_remote_code", f"{_ARR}.model.trust_remote_code",
             "{key}={value[0]}: model code from the repository is not run in this build; only architectures that "
             "transformers ships load", lambda v: v[0] is True and v[1] is not True),
    _follows("critic.model.tokenizer_path", f"{_ARR}.model.path",
             "{key}={value[0]}: the critic reads the policy's tokens, from the tokenizer of actor_rollout_ref.model; "
             "ignored"),
    # actor and reference
    LaterWork(f"{_ARR}.actor.clip_ratio", lambda v, d=_default(ActorConfig, "clip_ratio"): v != d,
              "{key}={value}: the clip range is actor_rollout_ref.actor.clip_ratio_low / clip_ratio_high (each 0.2 by "
              "default, as in verl); set those; ignored"),
    _follows(f"{_ARR}.actor.use_remove_padding", f"{_ARR}.model.use_remove_padding",
             "{key}={value[0]}: padding removal follows actor_rollout_ref.model.use_remove_padding={value[1]} for the "
             "actor, the reference and the old log-probs; set that key; ignored"),
    LaterWork(f"{_ARR}.actor.shuffle", lambda v: v is True,
              "{key}=True: mini-batches are taken in the rollout batch's order in this build; ignored"),
    _follows("critic.shuffle", f"{_ARR}.actor.shuffle",
             "{key}=True: mini-batches are taken in the rollout batch's order in this build; ignored",
             lambda v: v[0] is True and v[1] is not True),
    *(LaterWork(f"{_ARR}.{role}.{n}", lambda v: v is True, _ENTROPY)
      for role in ("actor", "ref") for n in ("entropy_from_logits_with_chunking", "entropy_checkpointing")),
    _follows(f"{_ARR}.ref.strategy", f"{_ARR}.actor.strategy",
             "{key}={value[0]}: the reference runs on actor_rollout_ref.actor.strategy={value[1]}'s engine; ignored"),
    _follows(f"{_ARR}.ref.ulysses_sequence_parallel_size", f"{_ARR}.actor.ulysses_sequence_parallel_size",
             _NOT_HERE.replace("{value}", "{value[0]}"), lambda v: v[0] > 1 and v[0] != v[1]),
    LaterWork(f"{_ARR}.ref.model", lambda v: v is not None,
              "{key}={value}: a separate reference model is not available in this build; the reference is the "
              "policy's initial weights (actor_rollout_ref.model); ignored"),
    *_optim_rows(f"{_ARR}.actor.optim"),
    *_optim_rows("critic.optim"),
    *_checkpoint_rows(f"{_ARR}.actor.checkpoint", everything=False),
    *_checkpoint_rows("critic.checkpoint", everything=True),
    *(_block_row(f"{node}.profiler", default, _VERL_PROFILER) for node, default in (
        (f"{_ARR}.actor", RoleProfilerConfig()), (f"{_ARR}.ref", RoleProfilerConfig()),
        (f"{_ARR}.rollout", follower_profiler()), ("critic", RoleProfilerConfig()),
        ("reward_model", follower_profiler(reward_model=True)))),
    # rollout
    *_native_only_rows(f"{_ARR}.rollout"),
    LaterWork(f"{_ARR}.rollout.mode", lambda v, d=_default(RolloutConfig, "mode"): v != d,
              "{key}={value}: the rollout runs inside the training process (no server); ignored"),
    LaterWork(f"{_ARR}.rollout.load_format", lambda v, d=_default(RolloutConfig, "load_format"): v != d,
              "{key}={value}: vLLM's weight loading; the native and hf rollouts use the policy's weights; ignored"),
    LaterWork(f"{_ARR}.rollout.layered_summon", lambda v: v is True,
              "{key}=True: the rollout's weights are refreshed one tensor at a time already; ignored"),
    LaterWork(f"{_ARR}.rollout.update_weights_bucket_megabytes",
              lambda v, d=_default(RolloutConfig, "update_weights_bucket_megabytes"): v != d,
              "{key}={value}: the rollout's weights are refreshed in place one tensor at a time (no buckets); ignored"),
    LaterWork(f"{_ARR}.rollout.max_model_len", lambda v: v is not None,
              "{key}={value}: sequences are data.max_prompt_length + data.max_response_length tokens at most; "
              "checked against that, otherwise ignored"),
    LaterWork(f"{_ARR}.rollout.disable_log_stats", lambda v: v is False,
              "{key}=False: the native engine reports its statistics as rollout/* metrics every step; ignored"),
    _block_row(f"{_ARR}.rollout.engine_kwargs", EngineKwargsConfig(),
               "vLLM/SGLang/TensorRT-LLM engine arguments are not used by the native or hf rollout"),
    _block_row(f"{_ARR}.rollout.agent", AgentLoopConfig(),
               "verl's agent-loop workers are not used; rlforge's agent loop runs in the training process "
               "(rollout.multi_turn.enable)"),
    _block_row(f"{_ARR}.rollout.trace", TraceConfig(), "rollout tracing is not available in this build"),
    _block_row(f"{_ARR}.rollout.multi_turn", MultiTurnSchema(),
               "multi_turn.enable is false, so the rollout is single-turn", lambda c: not _mt(c)["enable"],
               skip=("enable",)),
    *_unless_default(f"{_ARR}.rollout.multi_turn", MultiTurnSchema, ("use_inference_chat_template",
                     "tokenization_sanity_check_mode"),
                     "{key}={value}: turns are kept as token ids (never re-rendered or re-tokenized), so there "
                     "is nothing to change or check; ignored"),
    LaterWork(f"{_ARR}.rollout.multi_turn.num_repeat_rollouts", lambda v: v is not None,
              "{key}={value}: each prompt gets actor_rollout_ref.rollout.n conversations; ignored"),
    LaterWork(f"{_ARR}.rollout.skip_rollout", lambda v: v is True,
              "{key}=True: replaying dumped rollouts is not available in this build; generating"),
    LaterWork(f"{_ARR}.rollout.skip_dump_dir", lambda v, d=_default(RolloutConfig, "skip_dump_dir"): v != d,
              "{key}={value}: dumped rollouts are not replayed in this build (rollout.skip_rollout); ignored"),
    # critic
    _follows("critic.rollout_n", f"{_ARR}.rollout.n",
             "{key}={value[0]}: the critic sees actor_rollout_ref.rollout.n={value[1]} responses per prompt; ignored"),
    # trainer
    LaterWork("trainer.log_val_generations", lambda v: v > 0,
              "{key}={value}: validation samples are not logged in this build yet; only their scores are"),
    LaterWork("trainer.rollout_data_dir", lambda v: v is not None, _NO_DUMP),
    LaterWork("trainer.validation_data_dir", lambda v: v is not None, _NO_DUMP),
    LaterWork("trainer.esi_redundant_time", lambda v: v != 0,
              "{key}={value}: no preemption notice is watched in this build; ignored"),
    LaterWork("trainer.default_hdfs_dir", lambda v: v is not None,
              "{key}={value}: checkpoints are not copied to remote storage in this build; ignored"),
    LaterWork("trainer.del_local_ckpt_after_load", lambda v: v is True,
              "{key}=True: the checkpoint is kept after resuming from it; ignored"),
    _follows("trainer.max_critic_ckpt_to_keep", "trainer.max_actor_ckpt_to_keep",
             "{key}={value[0]}: one global_step folder holds actor and critic, and trainer.max_actor_ckpt_to_keep="
             "{value[1]} decides how many are kept; ignored", lambda v: v[0] is not None and v[0] != v[1]),
    *_unless_default("trainer", TrainerConfig, ("ray_wait_register_center_timeout", "use_legacy_worker_impl"),
                     "{key}={value}: a verl (Ray worker) setting; rlforge has no Ray workers; ignored"),
    LaterWork("ray_kwargs.ray_init", _ray_settings, _NO_RAY),
    LaterWork("ray_kwargs.timeline_json_file", lambda v: v is not None, _NO_RAY),
    LaterWork("ray_init", _ray_settings, _NO_RAY),
    *_global_profiler_rows(),
    *_data_rows(),
    # algorithm
    LaterWork("algorithm.use_pf_ppo", lambda v: v is True,
              "{key}=True: PF-PPO's reweighting of samples by reward is not implemented in this build; every "
              "sample keeps weight 1"),
    *_unless_default("algorithm.pf_ppo", PFPPOConfig, ("reweight_method", "weight_pow"),
                     "{key}={value}: PF-PPO (algorithm.use_pf_ppo) is not implemented in this build; ignored"),
    # reward manager
    LaterWork("reward_model.launch_reward_fn_async", lambda v: v is True,
              "{key}=True: rewards are computed in the step, before the log-prob passes (reward_model.timeout_s "
              "runs the scorers in worker processes); ignored"),
    _block_row("reward_model.sandbox_fusion", SandboxFusionConfig(),
               "verl's sandbox_fusion code reward is not used; a multi-turn python tool takes sandbox_fusion_url "
               "in its own config (rollout.multi_turn.tool_config_path)"),
    LaterWork("reward_model.overlong_buffer.log", lambda v: v is True,
              "{key}=True: with reward_model.overlong_buffer.enable the penalty is kept per sample in the reward's "
              "extra info (overlong_reward, overlong) whether or not this is set; nothing changes"),
)
"""Every accepted-but-not-effective key; the only place this list lives."""


@functools.cache
def _schema_defaults() -> RLForgeConfig:
    """The schema's defaults (verl's), interpolations unresolved (``"${...}"`` strings)."""
    return RLForgeConfig()


def _verl_default(cfg: Any, key: str) -> bool:
    """Whether ``key`` holds its schema default (verl's), a plain value rather than one that follows
    another key: a row that matters then reports rlforge's choice, which changes what verl would do
    (``rollout.name=vllm``: the native engine runs)."""
    try:
        default = get_key(_schema_defaults(), key)
    except (KeyError, AttributeError):  # a sub-key of a free-form field: no schema default
        return False
    return not (isinstance(default, str) and "${" in default) and get_key(cfg, key) == default


def _users_part(cfg: Any, row: LaterWork, value: Any) -> Any:
    """``value`` when the user set the row's key (:func:`~rlforge.config.user_keys.user_set`) or it
    holds verl's default (:func:`_verl_default`); for a row whose message shows ``{value_list}``
    (``key`` / ``key=value`` entries), the entries the user set; None when nothing is left.  A value
    that the embedded job brought, or that follows another key (``ref.megatron.*`` the actor's),
    is none of the user's business."""
    if "{value_list}" in row.message:  # value: a list of `key` / `key=value` entries
        return [v for v in value if user_set(cfg, str(v).partition("=")[0])] or None
    return value if user_set(cfg, row.key) or _verl_default(cfg, row.key) else None


def later_work_warnings(cfg: Any) -> list[str]:
    """One warning line per :data:`LATER_WORK` row whose value matters and that the user set (the
    ``--config`` file or an override; not the embedded job), plus skipped loggers."""
    out: list[str] = []
    for row in LATER_WORK:
        value = row.value_of(cfg) if row.value_of else get_key(cfg, row.key)
        if row.matters(value) and (value := _users_part(cfg, row, value)) is not None:
            shown = ", ".join(map(str, value)) if isinstance(value, list) else value
            out.append(row.message.format(key=row.key, value=value, value_list=shown))
    out += verl_only_warnings(verl_values(cfg))  # verl's keys that rlforge's schema does not type
    for name in cfg.trainer.logger:
        if name in VERL_LOGGERS:
            out.append(f"trainer.logger: '{name}' (a verl logger) is not supported by rlforge yet; skipped. "
                       f"rlforge logs to {', '.join(SUPPORTED_LOGGERS)}")
        elif name not in SUPPORTED_LOGGERS:
            close = difflib.get_close_matches(str(name), [*SUPPORTED_LOGGERS, *VERL_LOGGERS], n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"trainer.logger: unknown logger '{name}'.{hint} "
                              f"Valid: {', '.join(SUPPORTED_LOGGERS)}")
    return out


def effective_loggers(cfg: Any) -> list[str]:
    """``trainer.logger`` restricted to :data:`SUPPORTED_LOGGERS`, in order, without duplicates."""
    out: list[str] = []
    for name in cfg.trainer.logger:
        if name in SUPPORTED_LOGGERS and name not in out:
            out.append(name)
    return out

"""verl's Hydra config groups and base configs, as rlforge's built-in groups.

verl composes its PPO config from ``verl/trainer/config``: the primary ``ppo_trainer.yaml`` lists
one option per group (``model_engine: dp``, ``actor@actor_rollout_ref.actor: ${model_engine}_actor``,
``data@data: legacy_data``, ...).  rlforge's schema defaults are verl's ``ppo_trainer``, so an
option whose values are verl's defaults adds nothing here (an empty layer).  What the options change:

* the engine: ``model_engine: megatron`` selects ``megatron_actor``, ``megatron_ref`` and
  ``megatron_critic``, whose ``strategy`` is ``megatron`` (verl's ``ppo_megatron_trainer.yaml`` is
  ``ppo_trainer`` with ``override model_engine: megatron``).  verl's Megatron optimizer group names
  its optimizer ``adam`` (Megatron's distributed Adam, decoupled weight decay as AdamW), which is
  what rlforge's Megatron engine runs, so ``optim.optimizer`` keeps rlforge's name;
* the engines rlforge does not have (TorchTitan, VeOmni, AutoModel): a warning, the role keeps
  rlforge's strategy.

Source: verl ``verl/trainer/config/{ppo_trainer,ppo_megatron_trainer}.yaml`` and the group folders
(``actor/``, ``ref/``, ``critic/``, ``model_engine/``, ...) at 1dda039 (0.10.0.dev; v0.9.0 has the
same groups).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class GroupOption:
    """One option of a built-in group: its values, relative to the group's package, or why rlforge
    cannot honour it (then ``layer`` is empty and a warning names ``unsupported``)."""

    layer: dict[str, Any] = field(default_factory=dict)
    unsupported: str | None = None


@dataclass(frozen=True)
class Group:
    """A built-in config group: where its options land when an entry names no ``@package``
    (verl's own placement, e.g. ``actor`` -> ``actor_rollout_ref.actor``), and its options."""

    package: str
    options: dict[str, GroupOption]


_MEGATRON = GroupOption({"strategy": "megatron"})


def _no_engine(name: str) -> GroupOption:
    return GroupOption(unsupported=f"rlforge has no {name} engine (it trains with fsdp, fsdp2 or megatron); "
                       "the role keeps rlforge's strategy")


def _engine_group(package: str, suffix: str, default: str) -> Group:
    """actor / ref / critic: ``<engine>_<suffix>`` options, plus the group's base ``<default>``."""
    return Group(package, {
        default: GroupOption(), f"dp_{suffix}": GroupOption(), f"megatron_{suffix}": _MEGATRON,
        f"torchtitan_{suffix}": _no_engine("TorchTitan"), f"veomni_{suffix}": _no_engine("VeOmni"),
    })


def _backend_group(package: str) -> Group:
    """optim / engine: settings of one engine; verl's values for fsdp and megatron are rlforge's defaults."""
    return Group(package, {"fsdp": GroupOption(), "megatron": GroupOption(), "torchtitan": _no_engine("TorchTitan"),
                           "veomni": _no_engine("VeOmni"), "automodel": _no_engine("AutoModel")})


def _plain(package: str, *options: str) -> Group:
    return Group(package, {name: GroupOption() for name in options})


GLOBAL_PACKAGE = "_global_"
"""Hydra's name for the root of the config."""

GROUPS: dict[str, Group] = {
    "model_engine": Group(GLOBAL_PACKAGE, {
        "dp": GroupOption(), "megatron": GroupOption(),  # the engine itself comes from ${model_engine}_actor etc.
        "torchtitan": _no_engine("TorchTitan"), "veomni": _no_engine("VeOmni"),
    }),
    "actor": _engine_group("actor_rollout_ref.actor", "actor", "actor"),
    "ref": _engine_group("actor_rollout_ref.ref", "ref", "ref"),
    "critic": _engine_group("critic", "critic", "critic"),
    "optim": _backend_group("optim"),
    "engine": _backend_group("engine"),
    "data": _plain("data", "legacy_data"),
    "rollout": _plain("actor_rollout_ref.rollout", "rollout"),
    "model": _plain("actor_rollout_ref.model", "hf_model"),
    "reward": _plain("reward", "reward"),
    "algorithm": _plain("algorithm.rollout_correction", "rollout_correction"),
    "distillation": _plain("distillation", "distillation"),
    "transfer_queue": _plain("transfer_queue", "transfer_queue"),
    "profiler": _plain("global_profiler", "profiler"),
    "npu_profile": _plain("npu_profile", "npu_profile"),
}
"""verl's config groups (the folders of ``verl/trainer/config``) and the options rlforge maps."""

_PPO_TRAINER_DEFAULTS: list[Any] = [
    {"model_engine": "dp"},
    {"actor@actor_rollout_ref.actor": "${model_engine}_actor"},
    {"data@data": "legacy_data"},
    {"ref@actor_rollout_ref.ref": "${model_engine}_ref"},
    {"rollout@actor_rollout_ref.rollout": "rollout"},
    {"model@actor_rollout_ref.model": "hf_model"},
    {"critic@critic": "${model_engine}_critic"},
    {"model@critic.model": "hf_model"},
    "legacy_reward_impl",
    {"reward@reward": "reward"},
    {"algorithm@algorithm.rollout_correction": "rollout_correction"},
    {"distillation@distillation": "distillation"},
    {"transfer_queue@transfer_queue": "transfer_queue"},
    "_self_",
]

BASE_CONFIGS: dict[str, list[Any]] = {
    "ppo_trainer": _PPO_TRAINER_DEFAULTS,
    "ppo_megatron_trainer": ["ppo_trainer", {"override model_engine": "megatron"}, "_self_"],
    "legacy_reward_impl": [],
}
"""verl's configs that rlforge builds in, by name: their defaults lists (their own values are
rlforge's schema defaults).  ``_generated_<name>`` (verl's flattened dumps) mean the same."""


def base_config(name: str) -> list[Any] | None:
    """The defaults list of verl's built-in config ``name`` (``ppo_trainer``, ``ppo_megatron_trainer``,
    with or without ``.yaml`` or the ``_generated_`` prefix); None when rlforge has no such config."""
    name = name.removesuffix(".yaml").removeprefix("_generated_")
    return BASE_CONFIGS.get(name)


def is_verl_config_dir(path: Any) -> bool:
    """Whether the folder ``path`` (a :class:`pathlib.Path`) is verl's own ``verl/trainer/config``
    (or a copy): its files hold verl's whole schema, so rlforge uses its built-in groups instead."""
    return bool((path / "actor" / "dp_actor.yaml").is_file() and (path / "ppo_trainer.yaml").is_file())

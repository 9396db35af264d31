"""What a resumed run may change: the current config against the checkpoint's ``config.yaml``.

Keys that shape the saved state (the model and tokenizer, LoRA, the critic's model, the
advantage estimator and the policy loss) cannot change: the weights and optimizer moments in the
checkpoint belong to the old value, so a change is one error naming every such key.  Any other key
takes effect: the config is read live every step, and the state that a checkpoint restores over
the config is put back to the new values here (the optimizer's learning rate, schedule, weight
decay and betas: :func:`apply_optim_settings`; the KL controller restarts from a changed
``algorithm.kl_ctrl``).  The changed keys are listed in one line, and the next checkpoint's
``config.yaml`` records the values really used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlforge.algorithms import POLICY_LOSSES, loss_hooks
from rlforge.errors import CheckpointError

FROZEN: tuple[str, ...] = tuple(
    [f"actor_rollout_ref.model.{k}" for k in ("path", "tokenizer_path", "override_config", "external_lib",
                                                "lora_rank", "lora_alpha", "target_modules", "exclude_modules",
                                                "lora_adapter_path")]
    + [f"critic.model.{k}" for k in ("path", "tokenizer_path", "override_config", "external_lib", "lora_rank",
                                     "lora_alpha", "target_modules", "exclude_modules", "lora_adapter_path")]
    + ["critic.enable", "data.tokenizer", "algorithm.adv_estimator", "actor_rollout_ref.actor.policy_loss.loss_mode"]
    + [k for name in POLICY_LOSSES.names() for k in loss_hooks(POLICY_LOSSES.get(name)).frozen_keys]
)
"""Keys (and sub-trees) whose value must equal the checkpoint's: they decide the saved state's shapes and meaning."""

IGNORED: tuple[str, ...] = ("trainer.resume_mode", "trainer.resume_from_path")
"""Keys that say how to resume, not what the run is; never reported."""

_UNSET = object()


@dataclass(frozen=True)
class Change:
    """One key whose value differs between the checkpoint's config and the current one."""

    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        def show(v: Any) -> str:
            s = "<unset>" if v is _UNSET else yaml.safe_dump(v, default_flow_style=True, width=10**6).strip()
            s = s.removesuffix("\n...").removesuffix("...").strip()
            return s if len(s) <= 60 else s[:57] + "..."

        return f"{self.key}: {show(self.old)} -> {show(self.new)}"


def _select(tree: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _UNSET
        tree = tree[part]
    return tree


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a.b.c": leaf}``; empty dicts and lists are leaves."""
    if isinstance(tree, dict) and tree:
        out: dict[str, Any] = {}
        for k, v in tree.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: tree}


def _under(key: str, roots: tuple[str, ...]) -> bool:
    return any(key == r or key.startswith(r + ".") for r in roots)


def _uses_critic(tree: Any) -> bool:
    """Whether a resolved config (a dict) trains a critic, as :func:`rlforge.config.root.uses_critic`."""
    enable = _select(tree, "critic.enable")
    if enable not in (None, _UNSET):
        return bool(enable)
    return _select(tree, "algorithm.adv_estimator") == "gae"


def frozen_changes(saved: Any, current: Any, keys: tuple[str, ...] = FROZEN) -> list[Change]:
    """The ``keys`` whose value differs between two resolved configs (dicts).  A key the saved config
    lacks (an older schema) is skipped, and so are ``critic.*`` keys when neither config trains a
    critic (GRPO's unused critic follows the actor's model path by interpolation)."""
    skip_critic = not (_uses_critic(saved) or _uses_critic(current))
    out = []
    for key in keys:
        if skip_critic and key.startswith("critic."):
            continue
        old, new = _select(saved, key), _select(current, key)
        if old is not _UNSET and old != new:
            out.append(Change(key, old, new))
    return out


def config_changes(saved_yaml: str, current_yaml: str,
                   frozen_keys: tuple[str, ...] = FROZEN) -> tuple[list[Change], list[Change]]:
    """Compare two resolved configs (``format_config`` YAML).  ``frozen_keys``: the trainer's
    :data:`FROZEN` (the SFT trainer passes its own, :data:`rlforge.trainer.sft_resume.SFT_FROZEN`).

    Returns:
        ``(changes, frozen)``: every differing key outside ``frozen_keys`` and :data:`IGNORED`
        (a key missing on one side shows as ``<unset>``), and the ``frozen_keys`` whose
        value differs (those absent from the saved config, written by an older schema, are skipped).
    """
    saved, current = yaml.safe_load(saved_yaml) or {}, yaml.safe_load(current_yaml) or {}
    frozen = frozen_changes(saved, current, frozen_keys)
    flat_old, flat_new = _flatten(saved), _flatten(current)
    changes = [Change(k, flat_old.get(k, _UNSET), flat_new.get(k, _UNSET))
               for k in sorted(set(flat_old) | set(flat_new))
               if flat_old.get(k, _UNSET) != flat_new.get(k, _UNSET) and not _under(k, frozen_keys + IGNORED)]
    return changes, frozen


def check_resume_config(ckpt: Path, config_file: str, current_yaml: str,
                        frozen_keys: tuple[str, ...] = FROZEN) -> list[Change]:
    """The allowed changes since checkpoint ``ckpt`` (empty when its config file is absent);
    ``frozen_keys`` as for :func:`config_changes`.

    Raises:
        CheckpointError: a :data:`FROZEN` key changed, naming every such key with both values.
    """
    path = ckpt / config_file
    if not path.is_file():
        return []
    try:
        changes, frozen = config_changes(path.read_text(), current_yaml, frozen_keys)
    except yaml.YAMLError as e:
        raise CheckpointError(f"checkpoint {ckpt}: {config_file} is not valid YAML ({e.__class__.__name__})") from None
    if frozen:
        raise CheckpointError(
            f"cannot resume from {ckpt} with a different {', '.join(str(c) for c in frozen)} (checkpoint -> now): "
            "the saved weights and optimizer state belong to the checkpoint's value. Resume with the checkpoint's "
            "value, or start a new run (another trainer.default_local_dir, or trainer.resume_mode=disable)"
        )
    return changes


@dataclass
class OptimSettings:
    """An engine's freshly built optimizer settings, taken before a checkpoint is loaded over them."""

    groups: list[dict[str, Any]]
    """Each parameter group's settings (``lr`` excluded), in order."""
    base_lrs: list[float]
    """Each group's peak learning rate (the schedule's ``base_lrs``)."""


def optim_settings(engine: Any) -> OptimSettings | None:
    """The settings of ``engine.optimizer`` as built from the current config (None without one)."""
    opt = getattr(engine, "optimizer", None)
    if opt is None:
        return None
    sched = getattr(engine, "scheduler", None)
    groups = [{k: v for k, v in g.items() if k not in ("params", "lr", "initial_lr")} for g in opt.param_groups]
    base = list(sched.base_lrs) if sched is not None else [float(g["lr"]) for g in opt.param_groups]
    return OptimSettings(groups, [float(b) for b in base])


def apply_optim_settings(engine: Any, fresh: OptimSettings | None) -> None:
    """After a checkpoint was loaded into ``engine``: put the current config's optimizer settings
    back (a checkpoint's optimizer state carries the old ``lr``, ``weight_decay``, ``betas``) and
    set each group's learning rate to the new peak times the new schedule at the restored step."""
    opt, sched = getattr(engine, "optimizer", None), getattr(engine, "scheduler", None)
    if opt is None or fresh is None or len(fresh.groups) != len(opt.param_groups):
        return
    lrs = []
    for group, settings, base in zip(opt.param_groups, fresh.groups, fresh.base_lrs, strict=True):
        group.update(settings)
        group["initial_lr"] = base
        lrs.append(base)
    if sched is not None:
        sched.base_lrs = list(fresh.base_lrs)
        lambdas = getattr(sched, "lr_lambdas", None)
        if lambdas is not None:  # LambdaLR (transformers' schedules): peak x factor at the restored step
            lrs = [base * float(fn(sched.last_epoch)) for base, fn in zip(fresh.base_lrs, lambdas, strict=True)]
        sched._last_lr = list(lrs)  # what get_last_lr() reports
    for group, lr in zip(opt.param_groups, lrs, strict=True):
        group["lr"] = lr

"""Offload, dtype and strategy combinations of each model role that cannot work, or would silently
do something other than asked: one :class:`ConfigError` naming the keys and the fix.

Checked per role (the actor; the reference when a KL term or the loss needs it; the critic when
one is trained), in the role's own blocks (``fsdp_config`` is ``critic.model.fsdp_config`` for the critic):

* ``strategy=megatron`` reads only the role's ``megatron`` block; ``fsdp_config.param_offload`` /
  ``optimizer_offload`` / ``offload_policy`` / ``model_dtype`` / ``mixed_precision`` set there would be
  ignored: the error names ``megatron.param_offload`` / ``optimizer_offload`` / ``dtype`` instead.
* ``strategy=fsdp`` (FSDP1) with ``offload_policy`` (FSDP1's ``CPUOffload(offload_params=True)``)
  in a trained role whose optimizer step may accumulate
  gradients over several micro-batches: FSDP1's CPU offload keeps only the LAST micro-batch's
  gradient when gradients accumulate outside ``no_sync()``, which is how the sharded engines
  accumulate (measured on an H200 with torch 2.11: the offloaded gradient equals the last
  micro-batch's alone; without offload, or with one micro-batch, they agree; FSDP2's
  ``CPUOffloadPolicy`` accumulates correctly).  verl turns CPU offload off for the FSDP1 actor
  for this reason ("it causes incorrect results when using grad accumulation") and reads
  ``offload_policy`` only under FSDP2.  Fix: ``strategy=fsdp2``, or ``param_offload`` (verl's meaning:
  the parameters wait on the CPU between phases, :mod:`rlforge.engine.param_offload`, which
  accumulates gradients as without offload, under FSDP1 and FSDP2 alike).  The reference (no
  gradients) may use ``offload_policy`` under FSDP1.
* fp16 in a trained role (``fsdp_config.model_dtype``, ``mixed_precision.param_dtype`` or
  ``reduce_dtype``, ``megatron.dtype=float16``): fp16 gradients need loss scaling (a grad
  scaler), which rlforge does not implement, so small gradients flush to zero and large ones
  overflow; fp16 master weights also round away updates of lr 1e-6.  Use bf16.  The reference
  (forward only) may compute in fp16.
* ``mixed_precision`` keys other than ``param_dtype`` / ``reduce_dtype`` / ``buffer_dtype`` and
  dtype names outside ``fp32 | bf16 | fp16`` (or ``float32 | bfloat16 | float16``) would be
  ignored or fail at model build.

Accepted on purpose:

* ``param_offload`` / ``offload_policy`` on a CPU run (``trainer.device=cpu``, or ``auto`` on a
  machine without a GPU; fsdp, fsdp2; ``megatron.param_offload`` likewise): there is nothing to offload to (the parameters already
  are in host memory) and FSDP's CPU offload needs an accelerator (it pins memory), so the
  engines run without it; ONE warning names every such key of the run.  ``optimizer_offload``
  on CPU is a no-op (the optimizer state already is in host memory), without a warning.

* ``offload_policy`` with ``strategy=fsdp`` where it cannot hurt (the reference, or one micro-batch
  per optimizer step): applied as FSDP1 ``CPUOffload``, like ``param_offload``, with a warning that
  verl would ignore it.
* bf16 on ``trainer.device=cpu``: CPU matmuls and gloo collectives take bf16 (FSDP1 and FSDP2,
  one process and 2 gloo ranks, were run so).
* ``model_dtype=bf16`` with ``optimizer_offload``: the bf16 AdamW moments go to the CPU and back like
  fp32 ones.  bf16 master weights themselves round away most updates at the usual learning rates
  (an update below ~2^-9 of a weight: lr 1e-6 against weights ~1e-2): a warning for a trained role
  with ``optim.lr < 1e-4``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlforge.config.common import get_key
from rlforge.config.world import run_world
from rlforge.errors import ConfigError

_ARR = "actor_rollout_ref"
DTYPE_NAMES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")
"""The dtype names ``fsdp_config.model_dtype`` and ``mixed_precision.*`` accept."""
MIXED_PRECISION_KEYS = ("param_dtype", "reduce_dtype", "buffer_dtype")
_FP16 = ("fp16", "float16")
_BF16 = ("bf16", "bfloat16")
BF16_MASTER_LR = 1e-4
"""Below this learning rate, bf16 master weights of a trained role get a warning."""


@dataclass(frozen=True)
class Role:
    """Where one role's settings live."""

    name: str
    strategy: str
    fsdp: str
    megatron: str
    trained: bool
    optim: str | None
    batching: str | None = None
    """The node with ``ppo_mini_batch_size``, ``ppo_micro_batch_size(_per_gpu)`` and ``use_dynamic_bsz``."""


def roles(cfg: Any, uses_ref: bool, uses_critic: bool) -> list[Role]:
    """The roles this run builds."""
    out = [Role("actor", f"{_ARR}.actor.strategy", f"{_ARR}.actor.fsdp_config", f"{_ARR}.actor.megatron", True,
                f"{_ARR}.actor.optim", f"{_ARR}.actor")]
    if uses_ref:  # built with the actor's strategy (rlforge.trainer.build) and the ref's own blocks
        out.append(Role("ref", f"{_ARR}.actor.strategy", f"{_ARR}.ref.fsdp_config", f"{_ARR}.ref.megatron", False, None))
    if uses_critic:
        out.append(Role("critic", "critic.strategy", "critic.model.fsdp_config", "critic.megatron", True,
                        "critic.optim", "critic"))
    return out


def _mixed(cfg: Any, role: Role) -> dict[str, Any]:
    mp = get_key(cfg, f"{role.fsdp}.mixed_precision")
    return dict(mp or {})


def _check_names(cfg: Any, role: Role) -> None:
    dtype = get_key(cfg, f"{role.fsdp}.model_dtype")
    if str(dtype) not in DTYPE_NAMES:
        raise ConfigError(f"{role.fsdp}.model_dtype={dtype!r}: expected one of {', '.join(DTYPE_NAMES)}")
    for k, v in _mixed(cfg, role).items():
        if k not in MIXED_PRECISION_KEYS:
            raise ConfigError(f"{role.fsdp}.mixed_precision.{k}: unknown key (it would be ignored); "
                              f"valid: {', '.join(MIXED_PRECISION_KEYS)}")
        if str(v) not in DTYPE_NAMES:
            raise ConfigError(f"{role.fsdp}.mixed_precision.{k}={v!r}: expected one of {', '.join(DTYPE_NAMES)}")


def _check_megatron(cfg: Any, role: Role) -> None:
    """FSDP settings under ``strategy=megatron`` would be ignored."""
    fsdp, meg = role.fsdp, role.megatron
    moved = {"param_offload": f"{meg}.param_offload", "optimizer_offload": f"{meg}.optimizer_offload",
             "offload_policy": f"{meg}.param_offload"}
    for key, instead in moved.items():
        if get_key(cfg, f"{fsdp}.{key}"):
            raise ConfigError(f"{fsdp}.{key}=true has no effect with {role.strategy}=megatron, which reads only "
                              f"the {meg} block; set {instead}=true instead (and {fsdp}.{key}=false)")
    dtype, mixed = get_key(cfg, f"{fsdp}.model_dtype"), _mixed(cfg, role)
    set_here = ([f"{fsdp}.model_dtype={dtype}"] if str(dtype) not in ("fp32", "float32") else []) + (
        [f"{fsdp}.mixed_precision={mixed}"] if mixed else [])
    if set_here:
        raise ConfigError(f"{' and '.join(set_here)} have no effect with {role.strategy}=megatron, which computes in "
                          f"{meg}.dtype; set {meg}.dtype (bfloat16, float16 or float32) instead and leave the "
                          f"{fsdp} dtypes at their defaults")


def _several_micro_batches(cfg: Any, role: Role) -> str | None:
    """Why an optimizer step of ``role`` may accumulate over several micro-batches, or None
    when the config guarantees one micro-batch per mini-batch (per rank)."""
    node = role.batching
    if node is None:
        return None
    if get_key(cfg, f"{node}.use_dynamic_bsz"):
        return f"{node}.use_dynamic_bsz=true packs each mini-batch into token-budget micro-batches"
    micro = get_key(cfg, f"{node}.ppo_micro_batch_size_per_gpu") or get_key(cfg, f"{node}.ppo_micro_batch_size")
    world = max(1, run_world(cfg).size)
    mini = int(get_key(cfg, f"{node}.ppo_mini_batch_size")) * int(cfg.actor_rollout_ref.rollout.n) // world
    if micro is not None and micro < mini:
        return (f"{node}.ppo_micro_batch_size_per_gpu={micro} splits each rank's mini-batch of {mini} sequences "
                f"into {-(-mini // micro)} micro-batches")
    return None


def cpu_run(device: str) -> bool:
    """Whether ``trainer.device`` runs on the CPU (``cpu``, or ``auto`` without a visible GPU)."""
    if device == "cpu":
        return True
    if device != "auto":
        return False
    import torch  # lazily: the config package stays light

    return not torch.cuda.is_available()


def _offload_keys(cfg: Any, role: Role, strategy: str) -> list[str]:
    """The parameter-offload keys set to true in ``role``'s FSDP block (fsdp/fsdp2)."""
    if strategy not in ("fsdp", "fsdp2"):
        return []
    return [f"{role.fsdp}.{k}" for k in ("param_offload", "offload_policy") if get_key(cfg, f"{role.fsdp}.{k}")]


def _cpu_offload_keys(cfg: Any, role: Role, strategy: str) -> list[str]:
    """The parameter-offload keys of ``role`` that a CPU run leaves off (its engine's block)."""
    if strategy == "megatron":
        return [f"{role.megatron}.param_offload"] if get_key(cfg, f"{role.megatron}.param_offload") else []
    return _offload_keys(cfg, role, strategy)


def _check_offload(cfg: Any, role: Role, strategy: str) -> None:
    """CPU offload of FSDP1 under gradient accumulation.  Checked unless ``trainer.device=cpu`` (which
    does not offload): with ``auto`` the same config will offload on a GPU machine."""
    on = [k for k in _offload_keys(cfg, role, strategy) if k.endswith(".offload_policy")]
    if not on or cfg.trainer.device == "cpu":
        return
    keys = " and ".join(f"{k}=true" for k in on)
    why = _several_micro_batches(cfg, role) if role.trained else None
    if strategy == "fsdp" and why is not None:
        raise ConfigError(
            f"{keys} with {role.strategy}=fsdp: FSDP1's CPU offload keeps only the last micro-batch's gradient when "
            f"gradients accumulate over several micro-batches ({why}), so the {role.name} would silently train on a "
            f"fraction of each mini-batch (verl turns CPU offload off for the FSDP1 actor for this reason). Set "
            f"{role.strategy}=fsdp2 (its CPUOffloadPolicy accumulates correctly), or use "
            f"{role.fsdp}.param_offload=true (parameters on the CPU between phases, as in verl) instead")


def _check_fp16(cfg: Any, role: Role, strategy: str) -> None:
    """fp16 in the gradient path of a trained role needs a grad scaler, which rlforge has not."""
    why = ("fp16 gradients need loss scaling (a grad scaler), which rlforge does not implement: small gradients "
           "would flush to zero and large ones overflow")
    if strategy == "megatron":
        dtype = get_key(cfg, f"{role.megatron}.dtype")
        if str(dtype) in _FP16:
            raise ConfigError(f"{role.megatron}.dtype={dtype} trains the {role.name} in fp16; {why}. "
                              f"Set {role.megatron}.dtype=bfloat16")
        return
    dtype = get_key(cfg, f"{role.fsdp}.model_dtype")
    if str(dtype) in _FP16:
        raise ConfigError(f"{role.fsdp}.model_dtype={dtype} keeps the {role.name}'s master weights in fp16, which "
                          f"rounds away small updates, and {why}. Set {role.fsdp}.model_dtype=fp32 (compute dtype: "
                          f"{role.fsdp}.mixed_precision.param_dtype=bf16)")
    for k in ("param_dtype", "reduce_dtype"):
        v = _mixed(cfg, role).get(k)
        if str(v) in _FP16:
            raise ConfigError(f"{role.fsdp}.mixed_precision.{k}={v} puts the {role.name}'s gradients in fp16; "
                              f"{why}. Set {role.fsdp}.mixed_precision.{k}="
                              f"{'bf16' if k == 'param_dtype' else 'fp32'}")


def check_precision_and_offload(cfg: Any, uses_ref: bool, uses_critic: bool) -> list[str]:
    """Raise :class:`ConfigError` for the first impossible or silently ignored combination (see
    the module docstring); return warning lines for the accepted-but-notable ones."""
    for role in roles(cfg, uses_ref, uses_critic):
        strategy = get_key(cfg, role.strategy)
        _check_names(cfg, role)
        if strategy == "megatron":
            _check_megatron(cfg, role)
        _check_offload(cfg, role, strategy)
        if role.trained:
            _check_fp16(cfg, role, strategy)
    return _warnings(cfg, roles(cfg, uses_ref, uses_critic))


def _warnings(cfg: Any, run_roles: list[Role]) -> list[str]:
    """The warning lines, once every error is checked.  :func:`cpu_run` may import torch
    (``trainer.device=auto``), so it is asked only for a role that sets an offload key."""
    warnings: list[str] = []
    cpu_offload: list[str] = []
    for role in run_roles:
        strategy = get_key(cfg, role.strategy)
        offload = _cpu_offload_keys(cfg, role, strategy)
        cpu_offload += offload if offload and cpu_run(cfg.trainer.device) else []
        if strategy == "fsdp" and get_key(cfg, f"{role.fsdp}.offload_policy") and not cpu_run(cfg.trainer.device):
            warnings.append(f"{role.fsdp}.offload_policy=true with {role.strategy}=fsdp: verl reads offload_policy "
                            "only with strategy=fsdp2 and ignores it for an FSDP1 actor; rlforge applies it as FSDP1 "
                            "CPUOffload (parameters, gradients and the optimizer step on CPU); param_offload=true is verl's "
                            "offload for FSDP1 (parameters on the CPU between phases)")
        lr = float(get_key(cfg, f"{role.optim}.lr")) if role.optim else None
        if (role.trained and strategy != "megatron" and str(get_key(cfg, f"{role.fsdp}.model_dtype")) in _BF16
                and lr is not None and lr < BF16_MASTER_LR):
            warnings.append(f"{role.fsdp}.model_dtype=bf16 keeps the {role.name}'s master weights in bf16, which "
                            f"rounds away an update smaller than ~2^-9 of the weight: with {role.optim}.lr={lr:g} "
                            "most updates are lost. Use model_dtype=fp32 (bf16 compute comes from mixed_precision)")
    if cpu_offload:
        warnings.append(f"{', '.join(f'{k}=true' for k in cpu_offload)} on a CPU run (trainer.device="
                        f"{cfg.trainer.device}): nothing to offload to, the parameters already are in host memory; "
                        "running without offload")
    return warnings

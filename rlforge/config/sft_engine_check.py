"""The SFT trainer's ``engine`` block (FSDP settings, :class:`rlforge.config.common.FSDPConfig`): the
combinations that cannot work or would be ignored, as :mod:`rlforge.config.precision` checks a PPO role's
``fsdp_config``.

Errors (one :class:`ConfigError` naming the key and the fix):

* a dtype name outside ``fp32 | bf16 | fp16`` (or the long names) in ``engine.model_dtype`` or
  ``engine.mixed_precision.*``, or a ``mixed_precision`` key other than ``param_dtype`` / ``reduce_dtype``
  / ``buffer_dtype``;
* fp16 master weights or gradients (``model_dtype``, ``mixed_precision.param_dtype`` / ``reduce_dtype``):
  rlforge has no grad scaler;
* ``engine.offload_policy`` with ``model.strategy=fsdp`` (FSDP1's ``CPUOffload``) when a step
  accumulates gradients over several micro-batches: FSDP1's CPU offload keeps only the last
  micro-batch's gradient then (:mod:`rlforge.config.precision`).  Not checked for ``trainer.device=cpu``.

Warnings: ``engine.wrap_policy.min_num_params`` under FSDP2 (FSDP1's size-based wrapping; FSDP2 shards per
decoder layer); ``param_offload`` / ``offload_policy`` on a CPU run (nothing to offload to).
"""

from __future__ import annotations

from typing import Any

from rlforge.config.precision import DTYPE_NAMES, MIXED_PRECISION_KEYS, cpu_run
from rlforge.errors import ConfigError

_FP16 = ("fp16", "float16")
_NO_SCALER = ("fp16 gradients need loss scaling (a grad scaler), which rlforge does not implement: small gradients "
              "would flush to zero and large ones overflow")


def _check_dtypes(engine: Any) -> None:
    if str(engine.model_dtype) not in DTYPE_NAMES:
        raise ConfigError(f"engine.model_dtype={engine.model_dtype!r}: expected one of {', '.join(DTYPE_NAMES)}")
    for k, v in dict(engine.mixed_precision or {}).items():
        if k not in MIXED_PRECISION_KEYS:
            raise ConfigError(f"engine.mixed_precision.{k}: unknown key (it would be ignored); "
                              f"valid: {', '.join(MIXED_PRECISION_KEYS)}")
        if str(v) not in DTYPE_NAMES:
            raise ConfigError(f"engine.mixed_precision.{k}={v!r}: expected one of {', '.join(DTYPE_NAMES)}")
    if str(engine.model_dtype) in _FP16:
        raise ConfigError(f"engine.model_dtype={engine.model_dtype} keeps the master weights in fp16, which rounds "
                          f"away small updates, and {_NO_SCALER}. Set engine.model_dtype=fp32 (compute dtype: "
                          "engine.mixed_precision.param_dtype=bf16)")
    for k in ("param_dtype", "reduce_dtype"):
        v = dict(engine.mixed_precision or {}).get(k)
        if str(v) in _FP16:
            raise ConfigError(f"engine.mixed_precision.{k}={v} puts the gradients in fp16; {_NO_SCALER}. Set "
                              f"engine.mixed_precision.{k}={'bf16' if k == 'param_dtype' else 'fp32'}")


def _several_micro_batches(cfg: Any) -> bool:
    d = cfg.data
    return bool(d.use_dynamic_bsz) or int(d.micro_batch_size_per_gpu) < int(d.train_batch_size)


def check_sft_engine(cfg: Any) -> list[str]:
    """Check ``cfg.engine`` of an SFT config (see the module docstring); return the warning lines.

    Raises:
        ConfigError: naming the key and the fix.
    """
    engine, strategy = cfg.engine, cfg.model.strategy
    _check_dtypes(engine)
    if strategy == "fsdp" and engine.offload_policy and cfg.trainer.device != "cpu" and _several_micro_batches(cfg):
        raise ConfigError(
            "engine.offload_policy=true with model.strategy=fsdp: FSDP1's CPU offload keeps only the last "
            "micro-batch's gradient when gradients accumulate over several micro-batches (data.use_dynamic_bsz, or "
            "data.micro_batch_size_per_gpu below the batch), so the model would silently train on a fraction of "
            "each batch. Set model.strategy=fsdp2 (its CPUOffloadPolicy accumulates correctly), or use "
            "engine.param_offload=true (the weights on the CPU between steps) instead")
    out = []
    if strategy == "fsdp2" and int(engine.wrap_policy.min_num_params or 0) > 0:
        out.append(f"engine.wrap_policy.min_num_params={engine.wrap_policy.min_num_params} does not apply with "
                   "model.strategy=fsdp2 (FSDP1's size-based wrapping; FSDP2 shards per decoder layer); ignored")
    offload = [f"engine.{k}=true" for k in ("param_offload", "offload_policy") if getattr(engine, k)]
    if offload and cpu_run(cfg.trainer.device):
        out.append(f"{', '.join(offload)} on a CPU run: the parameters already are in host memory; not offloaded")
    return out

"""What the FSDP1 and FSDP2 engines share: the data-parallel step, state dicts, weight sync.

Loss scaling under data parallelism.  FSDP averages gradients over the ``W`` data-parallel
ranks (all ranks, also with hybrid sharding).  Each rank holds ``1/W``-th of the
mini-batch; the engine sums the mini-batch totals over ranks (``T`` valid tokens, ``S``
sequences with a valid token, one ``all_reduce``) and gives every micro-batch loss
``LossScale(T / W, S / W)``.  Rank ``r``'s gradient is then ``W/T * sum_{rows of r}``, and
FSDP's average over ranks is ``1/T * sum_{all rows}``: exactly the gradient of the whole
global mini-batch, for any split over ranks and micro-batches.  The reported loss shares
are summed over micro-batches and ranks and divided by ``W`` (the global mini-batch
loss); other metrics are averaged over ranks.

Every rank must run the same number of forwards (FSDP's collectives): a rank with fewer
micro-batches runs its first micro-batch again with the loss multiplied by 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from rlforge.algorithms import loss_agg_globals
from rlforge.batch import Batch
from rlforge.engine.activation import clean_name
from rlforge.engine.base import (
    SAVED_S2,
    SAVED_TOKENS,
    ForwardFn,
    LossFn,
    LossScale,
    TrainEngine,
    copy_full_params,
)
from rlforge.engine.distributed import all_reduce_max, all_reduce_sum, get_world_size
from rlforge.engine.optim import build_optimizer, build_scheduler
from rlforge.engine.optim_offload import OffloadedOptimizer
from rlforge.engine.param_offload import Mover, ParamOffload, module_mover
from rlforge.engine.staging import combine_micro_metrics, saved_work, stage

ParamGroupSpec = Callable[[nn.Module], list[dict[str, Any]]] | Sequence[tuple[Callable[[str], bool], float]]
"""Optimizer parameter groups, built AFTER sharding: either a function of the (sharded)
module returning ``torch.optim`` groups, or ``[(predicate(name), lr_multiplier), ...]``
where ``name`` is the plain parameter name and the first matching predicate picks the
group (unmatched parameters: multiplier 1)."""

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
           "fp16": torch.float16, "float16": torch.float16}


def to_dtype(name: str | torch.dtype, key: str) -> torch.dtype:
    """``fp32`` / ``bf16`` / ``fp16`` (or the long names) as a torch dtype.

    Raises:
        ValueError: unknown name; ``key`` names the config option.
    """
    if isinstance(name, torch.dtype):
        return name
    if str(name) not in _DTYPES:
        raise ValueError(f"{key}={name!r}: expected one of {sorted(_DTYPES)}")
    return _DTYPES[str(name)]


def mixed_precision_dtypes(fsdp_cfg: Any, device: torch.device) -> tuple[torch.dtype, torch.dtype, torch.dtype]:
    """``(param_dtype, reduce_dtype, buffer_dtype)`` from ``fsdp_config.mixed_precision``.

    Unset: compute in bfloat16 on CUDA and float32 on CPU,
    reduce gradients in float32, buffers in float32.
    """
    mp = dict(getattr(fsdp_cfg, "mixed_precision", None) or {})
    default = "bf16" if device.type == "cuda" else "fp32"
    key = "fsdp_config.mixed_precision"
    return (to_dtype(mp.get("param_dtype", default), f"{key}.param_dtype"),
            to_dtype(mp.get("reduce_dtype", "fp32"), f"{key}.reduce_dtype"),
            to_dtype(mp.get("buffer_dtype", "fp32"), f"{key}.buffer_dtype"))


def cpu_offload_applies(fsdp_cfg: Any, device: torch.device) -> bool:
    """Whether FSDP's own CPU offload (``offload_policy``: FSDP2 ``CPUOffloadPolicy``, FSDP1 ``CPUOffload``)
    takes effect: set, and the compute device is an
    accelerator (a CPU run already keeps everything in host memory;
    :func:`rlforge.config.precision.check_precision_and_offload` warns about it)."""
    return bool(fsdp_cfg.offload_policy) and device.type != "cpu"


def build_param_groups(module: nn.Module, spec: ParamGroupSpec | None, base_lr: float) -> list[Any]:
    """Trainable parameters of the sharded ``module`` as optimizer groups (see :data:`ParamGroupSpec`)."""
    if spec is None:
        return [p for p in module.parameters() if p.requires_grad]
    if callable(spec):
        return spec(module)
    groups: list[dict[str, Any]] = [{"params": [], "lr": base_lr}] + [
        {"params": [], "lr": base_lr * float(mult)} for _, mult in spec
    ]
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        idx = next((i + 1 for i, (pred, _) in enumerate(spec) if pred(clean_name(name))), 0)
        groups[idx]["params"].append(p)
    return [g for g in groups if g["params"]]


def merge_metrics(per_micro: list[dict[str, Any]], device: torch.device) -> dict[str, float]:
    """Micro-batch metrics of all ranks: loss shares summed then divided by the world size, the rest averaged."""
    local = combine_micro_metrics(per_micro)  # one host read for the step's tensor metrics
    keys = sorted(local)
    world = get_world_size()
    total = all_reduce_sum([local[k] for k in keys], device)
    return {k: v / world for k, v in zip(keys, total, strict=True)}


class ShardedEngine(TrainEngine):
    """Common part of :class:`~rlforge.engine.fsdp2.FSDP2Engine` and
    :class:`~rlforge.engine.fsdp1.FSDP1Engine`: the constructor (mesh, sharding through the
    subclass's :meth:`_shard`, then the optimizer over the sharded parameters) and the step.

    Raises:
        RuntimeError: no process group is initialised.
    """

    strategy: str = "fsdp"
    module: nn.Module
    device: torch.device
    optimizer: torch.optim.Optimizer | None = None
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
    grad_clip: float = 1.0
    offloaded: OffloadedOptimizer | None = None
    """The host-resident optimizer state with ``fsdp_config.optimizer_offload`` (without
    parameter offload, which already runs the optimizer on the CPU); else None."""
    param_offload: ParamOffload | None = None
    """The parameters on the CPU between phases with ``fsdp_config.param_offload`` on an accelerator
    (not with ``offload_policy``, whose parameters already live on the CPU); else None."""
    trainable_state_only: bool = False
    """``state_dict`` holds only the parameters that train (a LoRA adapter: the frozen base is not
    saved) and ``load_state_dict`` expects exactly those; set by the job builder."""

    def __init__(
        self, module: nn.Module, device: torch.device, *, fsdp_config: Any = None,
        optim_cfg: Any | None = None, total_steps: int = 1, optim_key: str = "optim", grad_clip: float = 1.0,
        param_groups: ParamGroupSpec | None = None, gradient_checkpointing: bool = False,
        activation_offload: bool = False, mesh: Any = None, megatron_config: Any = None, role_key: str = "",
        compile_layers: bool = False, share_prompts: bool = False, trainable_state_only: bool = False,
    ) -> None:
        from rlforge.config.common import FSDPConfig
        from rlforge.engine.compile import compile_layers as compile_regions
        from rlforge.engine.distributed import build_mesh, is_initialized

        if not is_initialized():
            raise RuntimeError(f"strategy={self.strategy} needs torch.distributed: call rlforge.engine.distributed."
                               "init_distributed() (launch with torchrun, also for one device)")
        cfg = fsdp_config or FSDPConfig()
        self.device = device
        self.share_prompts = bool(share_prompts)
        self.trainable_state_only = bool(trainable_state_only)
        self.mesh = mesh or build_mesh(device.type, cfg.fsdp_size)
        if compile_layers:
            compile_regions(module, device)
        self.module = self._shard(module, cfg, gradient_checkpointing, activation_offload)
        self.grad_clip = grad_clip
        self._build_optimizer(optim_cfg, param_groups, total_steps, optim_key)
        if self.optimizer is not None and cfg.optimizer_offload and not cpu_offload_applies(cfg, device):
            self.offloaded = OffloadedOptimizer(self.optimizer, device)
        if cfg.param_offload and device.type != "cpu" and not cpu_offload_applies(cfg, device):
            enable_param_offload(self)

    def _mover(self) -> Mover:
        """How this strategy moves its parameters between host and device (:mod:`rlforge.engine.param_offload`)."""
        return module_mover(self.module)

    def phase(self) -> AbstractContextManager:
        """As :meth:`TrainEngine.phase`: the parameter offload's phase, or a no-op."""
        return self.param_offload.phase() if self.param_offload is not None else nullcontext()

    def _shard(self, module: nn.Module, cfg: Any, gradient_checkpointing: bool, activation_offload: bool) -> nn.Module:
        """Apply this strategy's sharding to ``module`` on ``self.device``/``self.mesh``."""
        raise NotImplementedError

    def _build_optimizer(self, optim_cfg: Any | None, param_groups: ParamGroupSpec | None, total_steps: int,
                         key: str) -> None:
        """AdamW + schedule over the sharded parameters (None config: a forward-only engine)."""
        self.optimizer = self.scheduler = None
        if optim_cfg is not None:
            groups = build_param_groups(self.module, param_groups, float(optim_cfg.lr))
            self.optimizer = build_optimizer(groups, optim_cfg)
            self.scheduler = build_scheduler(self.optimizer, optim_cfg, total_steps, key)

    # ------------------------------------------------------------------ micro-batches
    def _split(self, batch: Batch, micro_batch_size: int, max_token_len: int | None) -> tuple[list[Batch], Any]:
        if max_token_len is None:
            return batch.split(micro_batch_size), None
        from rlforge.engine.dynamic_batch import split_by_token_budget  # written alongside; lazy

        return split_by_token_budget(batch, max_token_len, "ppo_max_token_len_per_gpu", None, self.share_prompts)

    def _padded(self, micros: list[Batch]) -> Iterator[tuple[Batch, bool]]:
        """The micro-batches, then repeats of the first (flagged False) up to the ranks' maximum count."""
        n = int(all_reduce_max([float(len(micros))], self.device)[0])
        for i in range(n):
            yield (micros[i], True) if i < len(micros) else (micros[0], False)

    @torch.no_grad()
    def infer(self, batch: Batch, forward_fn: ForwardFn, micro_batch_size: int,
              max_token_len: int | None = None) -> dict[str, torch.Tensor]:
        """As :meth:`TrainEngine.infer`; rows come back in ``batch``'s order."""
        with self.phase():
            return self._infer(batch, forward_fn, micro_batch_size, max_token_len)

    def _infer(self, batch: Batch, forward_fn: ForwardFn, micro_batch_size: int,
               max_token_len: int | None) -> dict[str, torch.Tensor]:
        was_training = self.module.training
        self.module.eval()
        micros, order = self._split(batch, micro_batch_size, max_token_len)
        micros = stage(micros, self.device, self.share_prompts)
        outs: dict[str, list[torch.Tensor]] = defaultdict(list)
        try:
            for mb, real in self._padded(micros):
                res = forward_fn(self.module, mb)
                if real:
                    for k, v in res.items():
                        outs[k].append(v.float())
        finally:
            self.module.train(was_training)
        cat = {k: torch.cat(v, 0).cpu() for k, v in outs.items()}
        if order is not None:
            flat = [int(i) for grp in order for i in (grp if isinstance(grp, list | tuple) else [grp])]
            idx = torch.tensor(flat, dtype=torch.long)
            for k, v in cat.items():
                out = torch.empty_like(v)
                out[idx] = v
                cat[k] = out
        return cat

    def loss_scale(self, mini_batch: Batch) -> LossScale:
        """Global totals over all ranks divided by the world size (see the module docstring)."""
        local = loss_agg_globals(mini_batch["response_mask"].float())
        tok, seq = all_reduce_sum([local["global_num_tokens"], local["global_num_seqs"]], self.device)
        world = get_world_size()
        return LossScale(global_num_tokens=tok / world, global_num_seqs=seq / world, dp_size=world)

    def train_step(self, mini_batch: Batch, loss_fn: LossFn, micro_batch_size: int,
                   max_token_len: int | None = None) -> dict[str, float]:
        with self.phase():
            return self._train_step(mini_batch, loss_fn, micro_batch_size, max_token_len)

    def _train_step(self, mini_batch: Batch, loss_fn: LossFn, micro_batch_size: int,
                    max_token_len: int | None) -> dict[str, float]:
        if self.optimizer is None:
            raise RuntimeError("this engine has no optimizer (forward-only model)")
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        scale = self.loss_scale(mini_batch)
        micros, _ = self._split(mini_batch, micro_batch_size, max_token_len)
        micros = stage(micros, self.device, self.share_prompts)
        saved = None
        if self.share_prompts:  # every rank has the same setting: all take part in the sum
            saved = all_reduce_sum([float(x) for x in saved_work(micros)], self.device)
        per_micro: list[dict[str, Any]] = []
        for mb, real in self._padded(micros):
            loss, metrics = loss_fn(self.module, mb, scale)
            (loss if real else loss * 0.0).backward()
            if real:
                per_micro.append(metrics)
        max_norm = self.grad_clip if self.grad_clip and self.grad_clip > 0 else math.inf
        grad_norm = self._clip_grad_norm(max_norm)
        if math.isfinite(grad_norm):
            if self.offloaded is not None:
                self.offloaded.step()
            else:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        out = merge_metrics(per_micro, self.device)
        out["grad_norm"] = grad_norm
        if saved is not None:
            out[SAVED_TOKENS], out[SAVED_S2] = saved
        return out

    def _clip_grad_norm(self, max_norm: float) -> float:
        raise NotImplementedError

    # ------------------------------------------------------------------ state dicts
    @property
    def _OPTS(self) -> StateDictOptions:  # noqa: N802
        # On a CPU device the tensors already are on CPU; FSDP1's CPU-offload path crashes there.
        return StateDictOptions(full_state_dict=True, cpu_offload=self.device.type != "cpu",
                                ignore_frozen_params=self.trainable_state_only)

    def state_dict(self) -> dict[str, Any]:
        """Full (unsharded) CPU state; a collective (all ranks call it).  Only rank 0 gets
        the tensors (DCP's ``cpu_offload`` with ``full_state_dict``), the others empty dicts.
        Keys are the plain module's; the optimizer state is in ``torch.optim``'s own
        (integer-keyed) format, so the tests' single-process reference engine loads it and vice versa."""
        with self.phase():
            return self._state_dict()

    def _state_dict(self) -> dict[str, Any]:
        if self.optimizer is None:
            model, optim = get_model_state_dict(self.module, options=self._OPTS), None
        else:
            with self._state_on_device():
                model, fqn_optim = get_state_dict(self.module, [self.optimizer], options=self._OPTS)
            optim = _fqn_to_index(fqn_optim) if fqn_optim else {}
        if self.trainable_state_only:  # DCP keeps frozen aliases (a tied lm_head.weight): drop them too
            want = self._trainable_names()
            model = {k: v for k, v in model.items() if k in want}
        return {"model": model, "optimizer": optim,
                "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None}

    def _trainable_names(self) -> set[str]:
        return {clean_name(n) for n, p in self.module.named_parameters() if p.requires_grad}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a full state (every rank passes the whole dict, e.g. each reads the file).

        Raises:
            ValueError: with :attr:`trainable_state_only`, a model state whose keys are not
                exactly the trainable parameters' (e.g. a full fine-tuning checkpoint).
        """
        with self.phase():
            self._load_state_dict(state)

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        opts = StateDictOptions(full_state_dict=True, strict=not self.trainable_state_only)
        if self.trainable_state_only:
            want = self._trainable_names()
            extra, missing = sorted(set(state["model"]) - want), sorted(want - set(state["model"]))
            if extra or missing:
                raise ValueError(f"the saved model state is not this adapter's (extra {extra[:2]}, missing {missing[:2]})")
        if self.optimizer is not None and state.get("optimizer"):
            optim = _index_to_fqn(state["optimizer"], self._param_names())
            with self._state_on_device():
                set_state_dict(self.module, [self.optimizer], model_state_dict=state["model"],
                               optim_state_dict=optim, options=opts)
        else:
            set_model_state_dict(self.module, state["model"], options=opts)
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])

    @contextmanager
    def sharded_state(self) -> Iterator[dict[str, Any] | None]:
        """As :meth:`TrainEngine.sharded_state`: FQN-keyed model and optimizer shards (DCP's
        ``get_state_dict`` without ``full_state_dict``), the optimizer state on the device inside.  None
        with :attr:`trainable_state_only` (a LoRA adapter is small: it keeps the full format)."""
        if self.trainable_state_only:
            yield None
            return
        with self.phase(), self._state_on_device():
            yield self._sharded()

    def _sharded(self) -> dict[str, Any]:
        if self.optimizer is None:
            state: dict[str, Any] = {"model": get_model_state_dict(self.module)}
        else:
            model, optim = get_state_dict(self.module, [self.optimizer])
            state = {"model": model, "optimizer": optim}
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler.state_dict()
        return state

    def load_sharded_state(self, read: Callable[[dict[str, Any]], None]) -> None:
        """As :meth:`TrainEngine.load_sharded_state`."""
        if self.trainable_state_only:
            super().load_sharded_state(read)
        with self.phase(), self._state_on_device():
            state = self._sharded()
            read(state)
            if "optimizer" in state:
                set_state_dict(self.module, [self.optimizer], model_state_dict=state["model"],
                               optim_state_dict=state["optimizer"])
            else:
                set_model_state_dict(self.module, state["model"])
            if self.scheduler is not None:
                self.scheduler.load_state_dict(state["scheduler"])

    def _state_on_device(self) -> AbstractContextManager:
        """The optimizer state on the device for DCP's collectives (offloaded again after)."""
        return self.offloaded.all_on_device() if self.offloaded is not None else nullcontext()

    def _param_names(self) -> list[list[str]]:
        names = {id(p): clean_name(n) for n, p in self.module.named_parameters()}
        assert self.optimizer is not None
        return [[names[id(p)] for p in g["params"]] for g in self.optimizer.param_groups]

    # ------------------------------------------------------------------ weight sync
    def full_params_iter(self, device: torch.device | str | None = None,
                         keep: Callable[[str], bool] | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """As :meth:`TrainEngine.full_params_iter`; each subclass gathers its own way."""
        raise NotImplementedError(f"{type(self).__name__} does not gather its parameters")

    @torch.no_grad()
    def sync_to(self, target: nn.Module) -> None:
        """As :meth:`TrainEngine.sync_to`."""
        with self.phase():
            copy_full_params(self.full_params_iter(), target)


def enable_param_offload(engine: ShardedEngine) -> ParamOffload:
    """Give ``engine`` a :class:`~rlforge.engine.param_offload.ParamOffload` (its strategy's mover) and
    move its parameters to the CPU now.  The engines call it for ``fsdp_config.param_offload`` on an
    accelerator; the CPU tests call it directly (a real CPU-to-CPU round trip)."""
    engine.param_offload = ParamOffload(engine._mover(), engine.device)
    engine.param_offload.offload()
    return engine.param_offload


def _fqn_to_index(optim: dict[str, Any]) -> dict[str, Any]:
    """DCP's FQN-keyed optimizer state → ``torch.optim``'s integer-keyed format."""
    index: dict[str, int] = {}
    groups = []
    for g in optim["param_groups"]:
        ids = [index.setdefault(n, len(index)) for n in g["params"]]
        groups.append({**g, "params": ids})
    return {"state": {index[n]: s for n, s in optim["state"].items()}, "param_groups": groups}


def _index_to_fqn(optim: dict[str, Any], names: list[list[str]]) -> dict[str, Any]:
    """The inverse of :func:`_fqn_to_index`, with this optimizer's group layout ``names``."""
    flat = [n for g in names for n in g]
    groups = [{**g, "params": list(ns)} for g, ns in zip(optim["param_groups"], names, strict=True)]
    return {"state": {flat[int(i)]: s for i, s in optim["state"].items()}, "param_groups": groups}

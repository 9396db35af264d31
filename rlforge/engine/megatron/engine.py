"""``strategy=megatron``: tensor, pipeline and data parallelism built on ``torch.distributed``.

The name ``megatron`` and the ``megatron.*`` keys are verl's; Megatron-LM is not used.  The same
layouts are built from PyTorch's own parallel APIs: DTensor tensor parallelism
(``parallelize_module``), ``torch.distributed.pipelining`` schedules and FSDP2 over the
remaining (data-parallel) ranks, on one ``("pp", "dp", "tp")`` device mesh.

Construction, in torchtitan's order (``parallelize.py``), on the unsharded HF model:

1. sizes and checks (:mod:`~rlforge.engine.megatron.mesh`; a ``ConfigError`` names the key);
2. the mesh and groups;
3. this rank's pipeline stages (:class:`~rlforge.engine.megatron.stage.StageModule`, float32
   master weights, moved to the device);
4. tensor parallelism (:mod:`~rlforge.engine.megatron.tensor_parallel`);
5. activation checkpointing / offload wrappers per decoder layer;
6. FSDP2 ``fully_shard`` per layer and per stage over the ``dp`` mesh, when ``dp > 1`` or
   ``megatron.param_offload`` (``CPUOffloadPolicy``); mixed precision as the fsdp engines;
7. the optimizer (AdamW, one group; ``foreach`` off when plain and DTensor parameters mix) and schedule;
8. the runner: direct (``pp = 1``) or the pipeline schedule (:mod:`~rlforge.engine.megatron.pipeline`).

Data.  The trainer gives every rank its own rows, as for FSDP.  The ``tp * pp`` ranks of one
data-parallel index hold one model copy, so the engine first gathers their rows (the
*model-parallel group*), runs them together, and hands each rank back its own rows' outputs.  The
ranks of a group may hold different row counts, some none (the ``replica_samples`` layout of
:mod:`rlforge.config.sharding`, where only the data-parallel size divides the step's samples).
Each micro-batch's loss gets ``LossScale(T / dp, S / dp)`` (``T``, ``S``: global valid tokens
and sequences); FSDP averages over ``dp``, so the gradient is the global mini-batch gradient.

The role's forward and loss functions run unchanged on the last stage: they receive a
:class:`PrecomputedModel` whose call returns the output the stages computed for exactly that
micro-batch (vocabulary-parallel logits as a ``DTensor``, see
:mod:`rlforge.algorithms.vocab_parallel`).  Forwards that need something else from the model
(the padding-free packed forward, a policy loss's log Z head) are refused with a clear error.

Without a pipeline (``pp = 1``) micro-batches may differ in shape: under a token budget the rows
are grouped by length (:func:`~rlforge.engine.megatron.inputs.length_sorted_micro_batches`), and
every micro-batch is cut to its own longest prompt and response
(:func:`~rlforge.engine.megatron.inputs.trim_widths`), so the padded forward costs about the valid
tokens (the 1.5B benchmark batch: 119,808 padded positions for 36,450 tokens per GPU before).
Pipeline micro-batches must share one shape.  The engine keeps the usual number of micro-batches
(``ceil(rows / micro_batch_size)``, or the token-budget count under dynamic batching) and deals the
rows into that many micro-batches of equal row counts, balanced in valid tokens
(:func:`~rlforge.engine.megatron.inputs.pipeline_micro_batches`); one short micro-batch is padded
by repeating a real row, cut off before the loss (compute, no effect).  The padded forward costs
``rows x seq`` whatever the split, so the budget decides the count, not the compute.  Under sequence
parallelism the sequence is right-padded to a multiple of ``tp`` (padding is masked).  Every
rank runs the same number of micro-batches (FSDP's collectives): missing ones repeat the first
with the loss multiplied by 0.
"""

from __future__ import annotations

import math
from collections import defaultdict
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from rlforge.algorithms import loss_agg_globals
from rlforge.batch import Batch
from rlforge.config.common import MegatronConfig
from rlforge.config.parallel_dims import parallel_dims
from rlforge.engine.activation import ActivationOffload, LayerWrapper, clean_name
from rlforge.engine.base import ENGINES, ForwardFn, LossFn, LossScale, TrainEngine
from rlforge.engine.distributed import (
    all_reduce_max,
    all_reduce_sum,
    get_rank,
    get_world_size,
    is_initialized,
)
from rlforge.engine.megatron.grads import clip_grads_, finalize_grads, global_grad_norm, sync_tied_grads
from rlforge.engine.megatron.inputs import (
    PrecomputedModel,
    align_widths,
    length_sorted_micro_batches,
    model_inputs,
    pipeline_micro_batches,
    trim_widths,
)
from rlforge.engine.megatron.mesh import build_parallel_mesh, check_model_fits
from rlforge.engine.megatron.pipeline import DirectRunner, PipelineRunner, StageShapes
from rlforge.engine.megatron.stage import StageModule, rank_stage_ids, stage_layer_ids
from rlforge.engine.megatron.state import WeightsAndState
from rlforge.engine.megatron.tensor_parallel import apply_tensor_parallel
from rlforge.engine.megatron.weights import plan_entries
from rlforge.engine.optim import build_optimizer, build_scheduler
from rlforge.engine.optim_offload import OffloadedOptimizer
from rlforge.engine.staging import combine_micro_metrics
from rlforge.errors import ConfigError

_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
           "float32": torch.float32, "fp32": torch.float32}


class StagedModel(nn.Module):
    """This rank's stages (``stages[k]`` is pipeline stage ``stage_ids[k]``) with the HF ``config``."""

    def __init__(self, stages: list[StageModule], stage_ids: list[int], config: Any) -> None:
        super().__init__()
        self.stages = nn.ModuleList(stages)
        self.stage_ids = stage_ids
        self.config = config


@ENGINES.register("megatron")
class MegatronEngine(WeightsAndState, TrainEngine):
    """One model split by tensor, pipeline and data parallelism (see the module docstring).

    Args:
        module: the unsharded HF model (``*ForCausalLM`` or ``*ForTokenClassification``,
            Llama/Qwen2 layout), identical on every rank; its layers are taken over.
        device: this rank's device.
        megatron_config: the role's ``megatron`` block (None = defaults).
        role_key: the role's config prefix (``actor_rollout_ref.actor``, ``critic``, ...), for errors.
        optim_cfg, total_steps, optim_key, grad_clip, gradient_checkpointing, activation_offload:
            as :class:`~rlforge.engine.fsdp2.FSDP2Engine`.
        fsdp_config, param_groups, mesh, share_prompts, trainable_state_only: accepted for the
            registry's signature; ``param_groups`` (a policy loss's extra head), ``share_prompts``
            and ``trainable_state_only`` are refused.
    Raises:
        ConfigError: sizes that do not fit the world or the model (naming the key), a policy loss's
            extra head.
        ValueError: ``share_prompts`` or ``trainable_state_only``.
        RuntimeError: no process group.
    """

    strategy = "megatron"
    packed_forward = False  # the stages run padded micro-batches; roles get their outputs
    head_readable_after_forward = False  # the LM head is split over the vocabulary

    def __init__(
        self, module: nn.Module, device: torch.device, *, fsdp_config: Any = None, megatron_config: Any = None,
        role_key: str = "actor_rollout_ref.actor", optim_cfg: Any | None = None, total_steps: int = 1,
        optim_key: str = "optim", grad_clip: float = 1.0, param_groups: Any = None,
        gradient_checkpointing: bool = False, activation_offload: bool = False, mesh: Any = None,
        compile_layers: bool = False, share_prompts: bool = False, trainable_state_only: bool = False,
    ) -> None:
        if share_prompts or trainable_state_only:
            raise ValueError("strategy=megatron runs neither shared prompts (it runs padded micro-batches) nor "
                             "a trainable-only state (LoRA)")
        if not is_initialized():
            raise RuntimeError("strategy=megatron needs torch.distributed: launch with torchrun (or "
                               "trainer.n_gpus_per_node > 1) and call rlforge.engine.distributed.init_distributed()")
        if compile_layers:
            from rlforge.engine.compile import compile_layers as compile_regions

            compile_regions(module, device)
        if param_groups is not None or callable(getattr(module, "forward_with_log_z", None)):
            raise ConfigError(f"{role_key}.strategy=megatron does not train the log Z head that "
                              f"{role_key}.policy_loss.loss_mode adds; use strategy=fsdp2")
        cfg = megatron_config or MegatronConfig()
        key = f"{role_key}.megatron"
        self.dims = dims = parallel_dims(cfg, get_world_size(), key)
        check_model_fits(dims, module.config, key)
        self.device, self.grad_clip = device, grad_clip
        self.pm = pm = build_parallel_mesh(dims, device.type)
        # offload moves parameters to host memory: a no-op when the device already is the CPU
        self.param_offload = bool(cfg.param_offload) and device.type != "cpu"
        self.use_fsdp = dims.dp > 1 or self.param_offload
        self.compute_dtype = _DTYPES.get(str(cfg.dtype), None) if device.type == "cuda" else torch.float32
        if self.compute_dtype is None:
            raise ConfigError(f"{key}.dtype={cfg.dtype!r}: expected bfloat16, float16 or float32")
        self.act_dtype = self.compute_dtype if self.use_fsdp else torch.float32
        self.optimizer_offload = bool(cfg.optimizer_offload) and not self.param_offload and device.type != "cpu"
        self._names = list(module.state_dict().keys())
        self._param_names = [n for n, _ in module.named_parameters()]
        self.tied = _tied(module)
        self.vocab = int(module.lm_head.weight.shape[0]) if hasattr(module, "lm_head") else 0

        module.to(torch.float32)
        self.stage_ids = rank_stage_ids(pm.pp_rank, dims.pp, dims.vpp)
        n_layers, n_stages = int(module.config.num_hidden_layers), dims.num_stages
        stages = [StageModule(module, stage_layer_ids(n_layers, n_stages, s), s == 0, s == n_stages - 1,
                              self.act_dtype).to(device) for s in self.stage_ids]
        offload_state = ActivationOffload() if activation_offload else None
        for st in stages:
            self._parallelize(st, cfg, gradient_checkpointing, offload_state)
        self.module = StagedModel(stages, self.stage_ids, module.config)
        self._local_params = self._collect_params()
        self._build_optimizer(optim_cfg, total_steps, optim_key)
        self.runner = self._build_runner(module.config)
        self._entries = plan_entries(self._local_state(), self._names, pm.pp_rank, pm.pp_group, dims.pp)
        self._tied_meta = self._plan_tied()
        self._bubbles: list[float] = []
        self._micro_counts: list[int] = []

    # ------------------------------------------------------------------ construction
    def _parallelize(self, stage: StageModule, cfg: Any, checkpointing: bool, offload: ActivationOffload | None) -> None:
        dims = self.dims
        if dims.tp > 1:
            apply_tensor_parallel(stage, self.pm.tp_mesh, dims.sequence_parallel, self.tied)
        if checkpointing or offload is not None:
            for idx in list(stage.model.layers.keys()):
                stage.model.layers[idx] = LayerWrapper(stage.model.layers[idx], checkpointing, offload)
        if not self.use_fsdp:
            return
        kw: dict[str, Any] = {
            "mesh": self.pm.dp_mesh,
            "mp_policy": MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32),
            "reshard_after_forward": dims.pp == 1,  # pipelining re-runs each layer per micro-batch
            "offload_policy": CPUOffloadPolicy() if self.param_offload else OffloadPolicy(),
        }
        for layer in stage.model.layers.values():
            fully_shard(layer, **kw)
        fully_shard(stage, **kw)

    def _collect_params(self) -> dict[str, nn.Parameter]:
        """This rank's parameters by their HF name (the tied head of the last stage under ``pp > 1``
        appears as ``lm_head.weight``)."""
        out: dict[str, nn.Parameter] = {}
        for st in self.module.stages:
            for n, p in st.named_parameters():
                out.setdefault(clean_name(n), p)
        return out

    def _build_optimizer(self, optim_cfg: Any | None, total_steps: int, key: str) -> None:
        self.optimizer = self.scheduler = None
        if optim_cfg is None:
            return
        params = [p for p in self._local_params.values() if p.requires_grad]
        self.optimizer = build_optimizer(params, optim_cfg)
        if len({isinstance(p, DTensor) for p in params}) > 1:
            for g in self.optimizer.param_groups:  # multi-tensor kernels cannot mix DTensors and plain tensors
                g["foreach"] = False
                g["fused"] = False
        self.scheduler = build_scheduler(self.optimizer, optim_cfg, total_steps, key)
        self.offloaded = OffloadedOptimizer(self.optimizer, self.device) if self.optimizer_offload else None

    def _build_runner(self, config: Any) -> DirectRunner | PipelineRunner:
        stages = list(self.module.stages)
        if self.dims.pp == 1:
            return DirectRunner(stages[0])
        out_width = -(-self.vocab // self.dims.tp) if self.vocab else 1
        shapes = StageShapes(int(config.hidden_size), self.dims.tp if self.dims.sequence_parallel else 1,
                             self.act_dtype, out_width, self.compute_dtype)
        return PipelineRunner(stages, self.stage_ids, self.dims.num_stages, self.pm.pp_group, self.pm.pp_ranks,
                              self.device, shapes)

    def _plan_tied(self) -> tuple[tuple[int, ...], torch.dtype] | None:
        """Local shape/dtype of the tied embedding/head copies when they sit on different stages."""
        if not (self.tied and self.dims.pp > 1):
            return None
        p = self._tied_param()
        mine = (tuple((p.to_local() if isinstance(p, DTensor) else p).shape), p.dtype) if p is not None else None
        parts: list[Any] = [None] * self.dims.pp
        dist.all_gather_object(parts, mine, group=self.pm.pp_group)
        return next(x for x in parts if x is not None)

    def _tied_param(self) -> nn.Parameter | None:
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if name in self._local_params:
                return self._local_params[name]
        return None

    # ------------------------------------------------------------------ data
    def autocast(self) -> AbstractContextManager:
        on = self.device.type == "cuda" and self.compute_dtype != torch.float32
        return torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=on)

    def _gather(self, batch: Batch) -> tuple[Batch, slice]:
        """The rows of the whole model-parallel group (on common widths, :func:`align_widths`),
        and where this rank's rows are in them."""
        ranks = self.pm.mp_ranks
        if len(ranks) == 1:
            return batch, slice(0, len(batch))
        parts: list[Any] = [None] * len(ranks)
        dist.all_gather_object(parts, batch.to("cpu"), group=self.pm.mp_group)
        start = sum(len(p) for p in parts[: ranks.index(get_rank())])
        return Batch.concat(align_widths(parts)), slice(start, start + len(batch))

    def _split(self, batch: Batch, micro_batch_size: int, max_token_len: int | None,
               key: str) -> tuple[list[Batch], torch.Tensor | None]:
        """Micro-batches without a pipeline (their shapes may differ): each cut to its own widths
        (:func:`trim_widths`); under a token budget, rows of similar length together
        (:func:`length_sorted_micro_batches`), so the padded forward costs about the valid tokens.
        Returns them and the permutation that restores the row order (None: unchanged)."""
        from rlforge.engine.dynamic_batch import restore_order

        if max_token_len is None:
            return [trim_widths(m) for m in batch.split(micro_batch_size)], None
        parts, order = length_sorted_micro_batches(batch, max_token_len, key)
        return [trim_widths(m) for m in parts], restore_order(order)

    def _seq_multiple(self) -> int:
        return self.dims.tp if self.dims.sequence_parallel else 1

    def _view(self, out: torch.Tensor, mb: Batch) -> PrecomputedModel:
        """What the role's function sees as the model for micro-batch ``mb``."""
        rows, cols = mb["input_ids"].shape
        x = out[:rows, :cols]
        if self.vocab and self.dims.tp > 1:
            x = DTensor.from_local(x.contiguous(), self.pm.tp_mesh, [Shard(2)], run_check=False,
                                   shape=torch.Size((rows, cols, self.vocab)),
                                   stride=(cols * self.vocab, self.vocab, 1))
        return PrecomputedModel(x, (rows, cols), self.module.config)

    def _count(self, n: int) -> int:
        """The number of micro-batches every rank runs (FSDP and the schedule need equal counts)."""
        n = int(all_reduce_max([float(n)], self.device)[0])
        return self.runner.min_micro_batches(n) if isinstance(self.runner, PipelineRunner) else n

    # ------------------------------------------------------------------ engine interface
    @torch.no_grad()
    def infer(self, batch: Batch, forward_fn: ForwardFn, micro_batch_size: int,
              max_token_len: int | None = None) -> dict[str, torch.Tensor]:
        was_training = self.module.training
        self.module.eval()
        group, mine = self._gather(batch)
        micros, restore = self._split(group, micro_batch_size, max_token_len, "log_prob_max_token_len_per_gpu")
        inputs = model_inputs(micros, self.device, self._seq_multiple(), pad_rows=False)
        n = int(all_reduce_max([float(len(inputs))], self.device)[0])
        inputs += [inputs[0]] * (n - len(inputs))
        outs: dict[str, list[torch.Tensor]] = defaultdict(list)

        width_r = int(group["responses"].shape[1])

        def out_cb(i: int, out: torch.Tensor) -> None:
            if i < len(micros):
                mb = micros[i].to(self.device)
                r = int(mb["responses"].shape[1])
                for k, v in forward_fn(self._view(out, mb), mb).items():
                    if v.ndim > 1 and v.shape[1] == r < width_r:  # back on the group's response width
                        v = torch.nn.functional.pad(v, (0, width_r - r))
                    outs[k].append(v.float().cpu())

        try:
            with self.autocast():
                self.runner.infer(inputs, out_cb)
        finally:
            self.module.train(was_training)
            self._reshard()
        result = {k: torch.cat(v, 0) for k, v in outs.items()}
        if restore is not None:
            result = {k: v[restore] for k, v in result.items()}
        if self.dims.pp > 1:
            box = [result]
            dist.broadcast_object_list(box, src=self.pm.pp_ranks[-1], group=self.pm.pp_group)
            result = box[0]
        width = batch["responses"].shape[1]  # response-aligned outputs: this rank's own width
        return {k: v[mine, :width] if v.ndim > 1 and v.shape[1] == group["responses"].shape[1] else v[mine]
                for k, v in result.items()}

    def loss_scale(self, mini_batch: Batch) -> LossScale:
        """Global totals over all ranks divided by the data-parallel size (see the module docstring)."""
        local = loss_agg_globals(mini_batch["response_mask"].float())
        tok, seq = all_reduce_sum([local["global_num_tokens"], local["global_num_seqs"]], self.device)
        return LossScale(global_num_tokens=tok / self.dims.dp, global_num_seqs=seq / self.dims.dp,
                         dp_size=int(self.dims.dp))

    def train_step(self, mini_batch: Batch, loss_fn: LossFn, micro_batch_size: int,
                   max_token_len: int | None = None) -> dict[str, float]:
        out = self.accumulate_grads(mini_batch, loss_fn, micro_batch_size, max_token_len)
        out["grad_norm"] = self.apply_grads()
        return out

    def accumulate_grads(self, mini_batch: Batch, loss_fn: LossFn, micro_batch_size: int,
                         max_token_len: int | None = None) -> dict[str, float]:
        """The first half of :meth:`train_step`: zero the gradients, run every micro-batch forward
        and backward, and leave the final gradients (partial sums reduced, tied copies summed).
        Returns the merged micro-batch metrics."""
        if self.optimizer is None:
            raise RuntimeError("this engine has no optimizer (forward-only model)")
        self.module.train()
        self.optimizer.zero_grad(set_to_none=True)
        scale = self.loss_scale(mini_batch)
        group, _ = self._gather(mini_batch)
        if self.dims.pp > 1:
            micros = pipeline_micro_batches(group, micro_batch_size, max_token_len, self.dims.pp)
        else:
            micros, _ = self._split(group, micro_batch_size, max_token_len, "ppo_max_token_len_per_gpu")
        inputs = model_inputs(micros, self.device, self._seq_multiple(), pad_rows=self.dims.pp > 1)
        n = self._count(len(inputs))
        self._micro_counts.append(len(inputs))
        inputs += [inputs[0]] * (n - len(inputs))
        per_micro: list[dict[str, float]] = []
        on_device: dict[int, Batch] = {}

        def loss_cb(i: int, out: torch.Tensor) -> torch.Tensor:
            real = i < len(micros)
            j = i if real else 0
            mb = on_device.setdefault(j, micros[j].to(self.device))
            loss, metrics = loss_fn(self._view(out, mb), mb, scale)
            if real:
                per_micro.append(metrics)
                return loss
            return loss * 0.0

        with self.autocast():
            self.runner.train(inputs, loss_cb)
        self._bubbles.append(self.runner.last_bubble)
        params = list(self._local_params.values())
        finalize_grads(params)
        if self._tied_meta is not None:
            sync_tied_grads(self._tied_param(), *self._tied_meta, self.pm.pp_group, self.device)
        return self._merge_metrics(per_micro)

    def apply_grads(self) -> float:
        """The second half of :meth:`train_step`: clip to ``grad_clip`` by the global norm, take the
        optimizer step (skipped when the norm is not finite), zero the gradients; returns the norm."""
        assert self.optimizer is not None
        params = list(self._local_params.values())
        counted = params
        if self._tied_meta is not None and "model.embed_tokens.weight" not in self._local_params:
            counted = [p for n, p in self._local_params.items() if n != "lm_head.weight"]  # counted on stage 0
        norm = global_grad_norm(counted, self.dims.tp * self.dims.dp, self.device)
        max_norm = self.grad_clip if self.grad_clip and self.grad_clip > 0 else math.inf
        if math.isfinite(norm):
            clip_grads_(params, norm, max_norm)
            if self.offloaded is not None:
                self.offloaded.step()
            else:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def _merge_metrics(self, per_micro: list[dict[str, Any]]) -> dict[str, float]:
        """Loss shares summed over micro-batches, others averaged; then the mean over model copies."""
        local = combine_micro_metrics(per_micro)
        if self.dims.pp > 1:  # only the last stage computed the losses
            box = [local]
            dist.broadcast_object_list(box, src=self.pm.pp_ranks[-1], group=self.pm.pp_group)
            local = box[0]
        keys = sorted(local)
        total = all_reduce_sum([local[k] for k in keys], self.device)
        world = get_world_size()
        return {k: v / world for k, v in zip(keys, total, strict=True)}

    def _reshard(self) -> None:
        """Free gathered FSDP parameters (kept after forward-only passes when pipelining)."""
        if self.use_fsdp and self.dims.pp > 1:
            for st in self.module.stages:
                st.reshard()

    def metrics(self) -> dict[str, float]:
        """``parallel/tp|pp|dp|vpp``: the mesh; ``parallel/pp_bubble``: the mean measured bubble
        fraction of the optimizer steps since the last call (0 without pipelining);
        ``parallel/num_micro_batches``: their mean number of micro-batches per model copy."""
        bubble = sum(self._bubbles) / len(self._bubbles) if self._bubbles else 0.0
        micro = sum(self._micro_counts) / len(self._micro_counts) if self._micro_counts else 0.0
        self._bubbles.clear()
        self._micro_counts.clear()
        return {"parallel/tp": float(self.dims.tp), "parallel/pp": float(self.dims.pp),
                "parallel/dp": float(self.dims.dp), "parallel/vpp": float(self.dims.vpp),
                "parallel/pp_bubble": bubble, "parallel/num_micro_batches": micro}


def _tied(module: nn.Module) -> bool:
    head = getattr(module, "lm_head", None)
    embed = getattr(getattr(module, "model", None), "embed_tokens", None)
    return head is not None and embed is not None and head.weight is embed.weight

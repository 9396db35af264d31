"""``NativeRollout``: the engine loop behind :class:`Rollout`, nano-vllm's ``schedule -> run -> postprocess``.

Each ``generate`` call turns every row of the left-padded prompt batch into a :class:`Sequence`
and loops until all finish: the scheduler picks the next step (:meth:`.Scheduler.schedule`),
:class:`~.overlap.Steps` runs it on the device and reads its tokens back into the scheduler
(:meth:`.Scheduler.update_burst`), and :class:`LoopHooks` act on what stopped (nothing for
single-turn generation; the agent loop, :mod:`rlforge.rollout.multi_turn.native`, runs a turn's
tools there and puts the sequence back with their tokens).  A step that mixes prefill chunks and
decodes runs eagerly.  A step where every sequence only decodes becomes a *burst*: up to
``max_decode_burst`` decode steps run back to back on the device (CUDA graphs on GPU), each feeding
its sampled tokens to the next, and the host reads all their tokens at once.  Tokens sampled after a
sequence's EOS inside a burst are dropped.  With ``overlap_steps`` (on by default) the host launches
each step before it reads the one before (:mod:`.overlap` holds what is in flight).

Memory (``free_cache_engine``): "wake" allocates the KV cache and captures the CUDA graphs
before generation; "sleep" frees both afterwards so training gets the memory back.  With
``free_cache_engine=False`` they are kept between calls and rebuilt only when the cache must
grow or the weights are new tensors.  ``rollout/wake_s`` and ``rollout/sleep_s`` time both.

Weights are read from the actor's module: each generation first refreshes the runner's
packed Q/K/V and gate/up matrices and, when the module's dtype is not the compute dtype, its
cast copies (:mod:`.rollout_weights`; packing is on by default on CUDA); every other weight is
the module's own tensor, read in place.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel

from rlforge.batch import Batch
from rlforge.errors import ConfigError, RLForgeError
from rlforge.progress import progress_bar
from rlforge.rollout.base import ROLLOUTS, Rollout, SamplingParams, assemble
from rlforge.rollout.native.block_manager import BlockManager, BlockManagerStats
from rlforge.rollout.native.cuda_graph import DecodeGraphs, capture_sizes, weights_key
from rlforge.rollout.native.forced_eos import force_eos, length_hook, sample_indices
from rlforge.rollout.native.kv_cache import KVCache
from rlforge.rollout.native.model_runner import (
    DecodeInputs,
    ModelRunner,
    ModelSpec,
    block_table_tensor,
    prepare_inputs,
    right_padded,
    unsupported_reason,
)
from rlforge.rollout.native.overlap import Burst, Mixed, Steps, device_index, pending_rows
from rlforge.rollout.native.resume import Resume, StopHooks, resume_sequences, strip_unread
from rlforge.rollout.native.rollout_weights import RolloutWeights
from rlforge.rollout.native.sampler import sample_with_log_probs
from rlforge.rollout.native.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from rlforge.rollout.native.sequence import Sequence
from rlforge.rollout.native.tensor_parallel import (
    Slice,
    TPGroup,
    check_same_outputs,
    check_tp_size,
    gather_prompts,
    group_seed,
    new_tp_group,
    shard_module_,
    shard_rules,
)


class LoopHooks:
    """What :meth:`NativeRollout.generate`'s loop does besides its steps.  These defaults (single-turn
    generation) do nothing; the agent loop's :class:`~rlforge.rollout.multi_turn.native.TurnHooks`
    runs the tools of each turn that ends and puts the sequence back into the scheduler."""

    def busy(self, steps: Steps) -> bool:
        """True while work outside the scheduler may still bring a sequence back (the loop goes on)."""
        return False

    def pause(self, steps: Steps) -> bool:
        """True when no step should be launched now: the loop calls :meth:`wait` instead."""
        return False

    def wait(self, steps: Steps) -> None:
        """Called instead of a step when :meth:`pause` says so."""

    def postprocess(self, steps: Steps) -> None:
        """Called after each step (or :meth:`wait`): act on the sequences that stopped."""

    def stop(self, steps: Steps) -> bool:
        """True ends the call now, with sequences unfinished (partial rollout's stopping rule)."""
        return False

    def close(self) -> None:
        """Called after the loop, also when it raised."""


@ROLLOUTS.register("native")
class NativeRollout(Rollout):
    """Paged-KV continuous-batching generation on the actor's own module.

    Args (beyond :class:`~rlforge.rollout.hf.HFRollout`'s):
        block_size: tokens per KV block.
        num_blocks: KV blocks in the cache; None = sized from ``gpu_memory_utilization`` on
            CUDA (capped at what every row needs at full length), or exactly that need on CPU.
        gpu_memory_utilization: fraction of the device's total memory the engine may hold for
            weights plus KV cache, as in vLLM (CUDA only; None = all free memory but 10%).
        max_num_seqs: sequences per step.
        max_num_batched_tokens: tokens per step (prefill chunk budget).
        enable_prefix_caching: share full prompt blocks between rows with the same prompt.
        seed: seed of the sampler's generator; None = torch's global RNG.
        enforce_eager: no CUDA graphs.
        cudagraph_capture_sizes: batch sizes to capture; None = the default ladder.
        free_cache_engine: free the KV cache and graphs after each ``generate``.
        calculate_log_probs: also return ``rollout_log_probs`` ``(batch, response_len)``
            float32 nats (0 past each response's end).
        ignore_eos: generate ``max_new_tokens`` for every row; EOS does not end a response.
        max_decode_burst: decode steps run on the device between two host reads (64: measured
            against 16/32/128 on one H200, benchmarks/history/RESULTS-log.md of 2026-12-02).
        overlap_steps: launch each step before reading the one before (see the module
            docstring); False = the host reads every step before it launches the next.
        attention: decode attention kernel, ``auto`` | ``triton`` | ``torch``.
        fused_kernels: the decoder layers' elementwise work in fused Triton kernels
            (:mod:`.triton_fused`); None = with the ``triton`` attention backend.
        pack_weights: Q/K/V and gate/up projections as one GEMM each, from copies refreshed
            before every generation (:mod:`.rollout_weights`); None = on CUDA.
        tp: this rank's tensor-parallel group (:mod:`.tensor_parallel`): ``module`` is sharded
            in place (each rank keeps its heads and MLP columns), the group generates the union of
            its ranks' prompts with a generator seeded alike, and each rank gets its own rows
            back; every rank of the group must call :meth:`generate` together.  CUDA graphs are
            off under TP (not yet measured with the per-layer all-reduces).  None = the whole
            model on this rank, today's path.

    Raises ValueError for a non-positive size.
    """

    def __init__(
        self,
        module: PreTrainedModel,
        eos_ids: list[int],
        pad_id: int,
        device: torch.device,
        autocast_dtype: torch.dtype | None = None,
        micro_batch_size: int | None = None,
        progress: bool = True,
        *,
        block_size: int = 16,
        num_blocks: int | None = None,
        gpu_memory_utilization: float | None = None,
        max_num_seqs: int = 1024,
        max_num_batched_tokens: int = 8192,
        enable_prefix_caching: bool = True,
        seed: int | None = None,
        enforce_eager: bool = False,
        cudagraph_capture_sizes: list[int] | None = None,
        free_cache_engine: bool = True,
        calculate_log_probs: bool = False,
        ignore_eos: bool = False,
        max_decode_burst: int = 64,
        overlap_steps: bool = True,
        attention: str = "auto",
        fused_kernels: bool | None = None,
        pack_weights: bool | None = None,
        tp: TPGroup | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"rollout block_size must be >= 1, got {block_size}")
        if num_blocks is not None and num_blocks < 1:
            raise ValueError(f"rollout num_blocks must be >= 1 or None, got {num_blocks}")
        if max_decode_burst < 1:
            raise ValueError(f"rollout max_decode_burst must be >= 1, got {max_decode_burst}")
        self.module = module
        self.eos_ids = list(eos_ids)
        self.pad_id = pad_id
        self.device = torch.device(device)
        self.autocast_dtype = autocast_dtype
        self.micro_batch_size = micro_batch_size  # unused: the scheduler batches; kept for the shared signature
        self.progress = progress
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.gpu_memory_utilization = gpu_memory_utilization
        self.scheduler_config = SchedulerConfig(max_num_seqs, max_num_batched_tokens)
        self.enable_prefix_caching = enable_prefix_caching
        self.seed = seed
        self.generator = None if seed is None else torch.Generator(self.device).manual_seed(seed)
        self.tp = tp
        self._slices: dict[str, Slice] = {}
        if tp is not None:
            self._slices = shard_rules(module, module, tp.rank, tp.size)
            shard_module_(module, self._slices)
        self.use_graphs = self.device.type == "cuda" and not enforce_eager and tp is None
        self.cudagraph_capture_sizes = cudagraph_capture_sizes
        self.free_cache_engine = free_cache_engine
        self.calculate_log_probs = calculate_log_probs
        self.ignore_eos = ignore_eos
        self.max_decode_burst = max_decode_burst
        self.overlap_steps = overlap_steps
        self.attention = attention
        self.fused_kernels = fused_kernels
        self.pack_weights = self.device.type == "cuda" if pack_weights is None else bool(pack_weights)
        self.last_stats: BlockManagerStats | None = None
        self.last_num_preemptions = 0
        self._last_metrics: dict[str, float] = {}
        self._forced_lengths: list[int | None] = []  # the benchmark hook's lengths (.forced_eos), per row
        self.last_sequences: list[Sequence] = []  # of the last generate call, row i first (partial rollout)
        self._cache: KVCache | None = None
        self._runner: ModelRunner | None = None
        self._graphs: DecodeGraphs | None = None
        self._runner_key: tuple[int, ...] = ()

    @property
    def collective(self) -> bool:
        """True under tensor parallelism (see :class:`~rlforge.rollout.base.Rollout`)."""
        return self.tp is not None

    def weight_slices(self) -> dict[str, Slice]:
        """See :class:`~rlforge.rollout.base.Rollout` (the sharded linears under TP, else empty)."""
        return dict(self._slices)

    def _spec(self) -> ModelSpec:
        """The model's spec on this rank (its share of the heads under TP)."""
        return ModelSpec.from_module(self.module, 1 if self.tp is None else self.tp.size)

    # ------------------------------------------------------------------ memory
    def _cache_dtype(self) -> torch.dtype:
        return self.autocast_dtype or next(self.module.parameters()).dtype

    def _blocks_needed(self, seqs: list[Sequence]) -> int:
        return sum(-(-s.max_len // self.block_size) for s in seqs)

    def _num_blocks(self, seqs: list[Sequence], spec: ModelSpec) -> int:
        """Blocks for this call: fixed ``num_blocks``, else every row at full length, capped on
        CUDA by the memory budget (raises RLForgeError when the budget holds no block)."""
        if self.num_blocks is not None:
            return self.num_blocks
        need = self._blocks_needed(seqs)
        if self.device.type != "cuda":
            return need
        per = KVCache.bytes_per_block(spec.num_layers, self.block_size, spec.num_kv_heads, spec.head_dim,
                                      self._cache_dtype())
        # The trainer's freed activations and gradients sit in PyTorch's cache, reserved but unused:
        # hand them back first, so that the budget sees what the trainer really keeps resident.
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info(self.device)
        vocab = self.module.lm_head.weight.shape[0]
        scratch = 2 * min(self.scheduler_config.max_num_seqs, len(seqs)) * vocab * 4  # logits and sampling buffers
        copies = RolloutWeights.planned_bytes(self.module, self._cache_dtype(), self.pack_weights)
        held = self._runner.weights.copy_bytes() if self._runner is not None else 0  # already out of `free`
        budget = free * 0.9 - scratch - (copies - held)
        if self.gpu_memory_utilization is not None:
            weights = sum(p.numel() * p.element_size() for p in self.module.parameters())
            budget = min(budget, self.gpu_memory_utilization * total - weights - copies - scratch)
        blocks = int(budget // per)
        if blocks < 1:
            raise RLForgeError(
                f"actor_rollout_ref.rollout.gpu_memory_utilization={self.gpu_memory_utilization}: no memory is "
                f"left for the KV cache ({free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB); raise it"
            )
        return min(need, blocks)

    def _wake(self, seqs: list[Sequence], spec: ModelSpec) -> tuple[ModelRunner, int]:
        """Allocate the cache (+1 spare block for graph padding) and capture the graphs, or
        reuse them; returns the runner and the number of blocks the block manager may use."""
        num_blocks = self._num_blocks(seqs, spec)
        max_blocks = max(-(-s.max_len // self.block_size) for s in seqs)
        batch = min(self.scheduler_config.max_num_seqs, len(seqs))
        key = weights_key(self.module)  # the runner and its graphs are built together from these weights
        reuse = (
            self._cache is not None and self._runner is not None and self._cache.num_blocks >= num_blocks + 1
            and self._runner_key == key
            and (self._graphs is None or (self._graphs.max_blocks >= max_blocks and self._graphs.sizes[-1] >= batch))
            and self._cache.data.dtype == self._cache_dtype()
        )
        if not reuse:
            self._sleep()
            try:
                self._cache = KVCache.allocate(spec.num_layers, num_blocks + 1, self.block_size, spec.num_kv_heads,
                                               spec.head_dim, self._cache_dtype(), self.device)
            except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
                need = (num_blocks + 1) * KVCache.bytes_per_block(spec.num_layers, self.block_size, spec.num_kv_heads,
                                                                  spec.head_dim, self._cache_dtype())
                raise RLForgeError(
                    f"the KV cache for {len(seqs)} rows of up to {max(s.max_len for s in seqs)} tokens needs "
                    f"{need / 2**30:.1f} GiB on {self.device} and could not be allocated ({str(e).splitlines()[0]}); "
                    "lower data.max_response_length or data.train_batch_size, or actor_rollout_ref.rollout."
                    "gpu_memory_utilization on a GPU"
                ) from None
            self._runner = ModelRunner(self.module, self._cache, self.attention, self.fused_kernels, self.pack_weights,
                                       self.tp)
            self._runner_key = key
            if self.use_graphs:
                sizes = capture_sizes(self.cudagraph_capture_sizes, batch)
                self._graphs = DecodeGraphs(self._runner, sizes, max_blocks, num_blocks * self.block_size)
        else:
            self._runner.refresh_weights()  # the trainer's in-place updates since the last generation
        assert self._runner is not None and self._cache is not None
        return self._runner, self._cache.num_blocks - 1

    def _sleep(self) -> None:
        """Free the KV cache and the graphs (their memory pool), returning the memory to training."""
        self._graphs = self._runner = self._cache = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ generation
    def _check_prompts(self, ids: torch.Tensor, mask: torch.Tensor) -> None:
        """Raises ValueError for an empty batch, a row without tokens, a row that is not
        left-padded, or a token id outside the model's vocabulary (naming the row)."""
        if ids.shape[0] == 0:
            raise ValueError("generate got an empty batch (0 prompt rows)")
        empty = (~mask.any(1)).nonzero()
        if len(empty):
            raise ValueError(f"prompt row {int(empty[0])} has no tokens (its attention_mask is all 0); every prompt "
                             "needs at least one token")
        holes = (mask[:, :-1] & ~mask[:, 1:]).any(1).nonzero()
        if len(holes):
            raise ValueError(f"prompt row {int(holes[0])} is not left-padded (its attention_mask has a 0 after a 1); "
                             "prompts must be left-padded")
        vocab = self.module.get_input_embeddings().weight.shape[0]
        bad = (mask & ((ids < 0) | (ids >= vocab))).nonzero()
        if len(bad):
            r, c = (int(x) for x in bad[0])
            raise ValueError(f"prompt row {r} holds token id {int(ids[r, c])} at column {c}, outside the model's "
                             f"vocabulary of {vocab} (is the tokenizer the model's?)")

    def _sequences(self, prompts: Batch, params: SamplingParams) -> list[Sequence]:
        """One :class:`Sequence` per prompt row (row ``i`` is ``seq_id`` ``i``).  Raises ValueError
        for bad prompts (see :meth:`_check_prompts`)."""
        ids, mask = prompts["input_ids"], prompts["attention_mask"].bool()
        self._check_prompts(ids, mask)
        # left-padded (checked above): row i's tokens are its last `len_i` columns; one numpy copy, not a
        # masked copy per row (1,024 x 256 prompts: 38 -> ~5 ms of host time)
        ids_np, starts = ids.cpu().numpy(), (ids.shape[1] - mask.sum(1)).tolist()
        seqs = [Sequence(i, ids_np[i, st:].tolist(), params.max_new_tokens) for i, st in enumerate(starts)]
        self._forced_lengths = self._imposed_lengths(prompts, seqs)
        return seqs

    def _imposed_lengths(self, prompts: Batch, seqs: list[Sequence]) -> list[int | None]:
        """The benchmark test hook's response lengths (:mod:`.forced_eos`), each row's ``stop_len``
        lowered to its own; all None when the hook is unset."""
        fn = length_hook()
        if fn is None:
            return [None] * len(seqs)
        given = prompts.non_tensor.get("sample_index")
        idx = sample_indices([s.prompt_ids for s in seqs], None if given is None else list(given))
        out: list[int | None] = []
        for s, i in zip(seqs, idx, strict=True):
            length = max(1, min(int(fn(s.prompt_ids, i)), s.max_new_tokens))
            s.stop_len = length
            out.append(length)
        return out

    def _eos(self) -> frozenset[int]:
        """The token ids that end a response (none with ``ignore_eos``)."""
        return frozenset() if self.ignore_eos else frozenset(self.eos_ids)

    def _hooks(self, prompts: Batch) -> LoopHooks:
        """What the loop does between steps for ``prompts``: nothing here (the agent loop: turns)."""
        return LoopHooks()

    def _scheduler(self, bm: BlockManager) -> Scheduler:
        """This call's scheduler over ``bm``."""
        return Scheduler(self.scheduler_config, bm, self._eos())

    def _max_burst(self) -> int:
        """Decode steps per burst at most."""
        return self.max_decode_burst

    @torch.no_grad()
    def generate(self, prompts: Batch, params: SamplingParams, resume: Resume | None = None) -> Batch:
        """See :class:`~rlforge.rollout.base.Rollout`; the loop is ``schedule -> run -> postprocess``
        (module docstring).  ``resume`` (partial rollout, :mod:`.resume`): each row continues from the
        tokens it already holds (re-prefilled) and the call ends as soon as ``resume.stop`` says so,
        its unfinished rows kept in :attr:`last_sequences`.  Raises ValueError for bad prompts (see
        :meth:`_check_prompts`), RLForgeError when the KV cache cannot be allocated or a sampled logit
        is not finite."""
        own, offset = prompts, 0
        if self.tp is not None:  # the group generates the union of its ranks' prompts, sampled alike
            prompts, offset = gather_prompts(prompts, self.tp)
            if self.seed is None:
                self.generator = torch.Generator(self.device).manual_seed(group_seed(self.tp))
        seqs = self._sequences(prompts, params)
        hooks = self._hooks(prompts) if resume is None else StopHooks(resume.stop, seqs)
        if resume is not None:
            resume_sequences(seqs, resume)
        spec = self._spec()
        m: dict[str, float] = {}
        t0 = time.perf_counter()
        with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None, cache_enabled=False):
            runner, num_blocks = self._wake(seqs, spec)
            m["rollout/wake_s"] = _elapsed(t0, self.device)
            capture0 = self._graphs.capture_s if self._graphs is not None else 0.0
            sched = self._scheduler(BlockManager(num_blocks, self.block_size, self.enable_prefix_caching))
            for s in seqs:
                sched.add(s)
            bar = progress_bar(total=len(seqs) * params.max_new_tokens, desc="gen", unit="tok", leave=False,
                               disable=not self.progress)
            steps = Steps(self, sched, runner, params, self._max_burst(), bar.update)
            t1 = time.perf_counter()
            try:
                while (sched.has_unfinished or hooks.busy(steps)) and not hooks.stop(steps):
                    if hooks.pause(steps):  # no step to launch now: read what is in flight, or wait for a tool
                        hooks.wait(steps)
                    else:
                        steps.run(steps.schedule())  # a launched burst goes on without a new schedule
                    hooks.postprocess(steps)
                steps.finish()
            finally:
                bar.close()
                hooks.close()
            m["rollout/gen_s"] = _elapsed(t1, self.device)
            m.update(steps.metrics(m["rollout/gen_s"]))
            m["rollout/graph_capture_s"] = (self._graphs.capture_s - capture0) if self._graphs is not None else 0.0
        t2 = time.perf_counter()
        if self.free_cache_engine:
            self._sleep()
        m["rollout/sleep_s"] = time.perf_counter() - t2
        self.last_stats, self.last_num_preemptions = sched.block_manager.stats, sched.num_preemptions
        self._finish_outputs(seqs)
        if self.tp is not None:
            check_same_outputs([s.output_ids for s in seqs], self.tp)
            return self._result(own, seqs[offset:offset + len(own)], sched, hooks, m)
        return self._result(prompts, seqs, sched, hooks, m)

    def _finish_outputs(self, seqs: list[Sequence]) -> None:
        """Drop tokens launched but never read (an early stop: they were not sampled for good), apply the
        benchmark's length hook (:mod:`.forced_eos`) and keep ``seqs`` as :attr:`last_sequences`."""
        strip_unread(seqs)
        if self.eos_ids and any(n is not None for n in self._forced_lengths):
            eos = self._eos()
            for s, length in zip(seqs, self._forced_lengths, strict=True):
                if s.is_finished:
                    force_eos(s.output_ids, length, self.eos_ids[0], eos)
        self.last_sequences = seqs

    def _result(self, prompts: Batch, seqs: list[Sequence], sched: Scheduler, hooks: LoopHooks,
                m: dict[str, float]) -> Batch:
        """The output batch; sets :meth:`metrics` from the loop's ``m``."""
        bm = sched.block_manager
        out_tokens = sum(len(s.output_ids) for s in seqs)
        self._last_metrics = {
            **m,
            "rollout/output_tokens_per_s": out_tokens / max(m["rollout/gen_s"], 1e-9),
            "rollout/num_preemptions": float(sched.num_preemptions),
            "rollout/kv_cache_peak_usage": bm.stats.peak_blocks_in_use / max(bm.num_blocks, 1),
            "rollout/prefix_hit_blocks": float(bm.stats.prefix_hit_blocks),
        }
        return self._assemble(prompts, seqs)

    def _launch_mixed(
        self, runner: ModelRunner, out: SchedulerOutput, params: SamplingParams, prev: Mixed | None = None
    ) -> Mixed:
        """Enqueue the mixed step ``out`` (prefill chunks and decodes) and the copy of its sampled
        tokens to the host; returns without waiting.  Decode rows whose last token is still a
        placeholder of ``prev`` (launched, not read) are fed that token on the device."""
        inp = prepare_inputs(out, self.block_size, self.device)
        rows, src = pending_rows(out.seqs, prev)
        if rows:
            if any(out.num_new_tokens[i] != 1 for i in rows):  # only a decode row feeds its newest token
                raise RLForgeError("internal: a sequence prefills a token that is not read yet")
            at = device_index([inp.query_start[i] for i in rows], self.device)
            inp.input_ids[at] = prev.tok[device_index(src, self.device)]
        logits = runner.run(inp)  # always run: a prefill chunk writes K/V even with nothing to sample
        sids = list(inp.sample_seq_ids)
        if not sids:
            return Mixed(sids, {}, None, (None, None, None), None)
        tok, lp, finite = sample_with_log_probs(logits, params, self.generator, self.calculate_log_probs)
        return Mixed(sids, {sid: i for i, sid in enumerate(sids)}, tok, *self._to_host(tok, lp, finite))

    def _to_host(self, *xs: torch.Tensor | None) -> tuple[tuple[Any, ...], Any]:
        """Copies of ``xs`` on the host (pinned, not waited for on CUDA) and the event that marks them done."""
        cuda = self.device.type == "cuda"  # non_blocking device-to-host copies land in pinned memory
        copies = tuple(None if x is None else x.to("cpu", non_blocking=cuda, copy=True) for x in xs)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        return copies, event

    def _launch_burst(
        self, runner: ModelRunner, out: SchedulerOutput, k: int, params: SamplingParams,
        first_ids: torch.Tensor | None = None, ahead: int = 0,
    ) -> Burst:
        """Enqueue ``k`` decode steps of the sequences in ``out`` (their slots reserved) and the
        copy of their tokens to the host; returns without waiting.  ``ahead``: tokens each
        sequence has sampled on the device that the host has not read yet (a launched burst's
        ``k``); ``first_ids``: those sequences' last sampled tokens ``[B]`` on the device, fed as
        step 1's input (None: each sequence's ``last_token``)."""
        seqs, b, bs = out.seqs, len(out.seqs), self.block_size
        pos0 = np.array([s.num_tokens - 1 + ahead for s in seqs], dtype=np.int64)
        host = DecodeInputs(
            torch.tensor([s.last_token for s in seqs], dtype=torch.long) if first_ids is None
            else first_ids.clone(),  # a view of the previous burst's tokens, which step 2's input writes
            torch.from_numpy(pos0),
            torch.zeros(b, dtype=torch.long),
            block_table_tensor([s.block_table for s in seqs], torch.device("cpu")),
            torch.from_numpy(pos0 + 1).to(torch.int32),
        )
        graphs = self._graphs
        size = graphs.bucket(b) if graphs is not None else None
        if graphs is not None and size is not None and host.block_tables.shape[1] <= graphs.max_blocks:
            d = graphs.view(b)
            graphs.reset_padding(b, size)
            d.block_tables.zero_()
            d.block_tables[:, : host.block_tables.shape[1]].copy_(host.block_tables, non_blocking=True)
            for name in ("input_ids", "positions", "context_lens"):
                getattr(d, name).copy_(getattr(host, name), non_blocking=True)
            forward = lambda: graphs.replay(size)[:b]  # noqa: E731
        else:
            d = DecodeInputs(*(t.to(self.device, non_blocking=True) for t in (
                host.input_ids, host.positions, host.slot_mapping, host.block_tables, host.context_lens)))
            forward = lambda: runner.decode(d)  # noqa: E731
        toks = torch.empty((b, k), dtype=torch.long, device=self.device)
        lps = torch.zeros((b, k), dtype=torch.float32, device=self.device) if self.calculate_log_probs else None
        finite = torch.ones((), dtype=torch.bool, device=self.device)
        for j in range(k):
            if j > 0:
                d.input_ids.copy_(toks[:, j - 1])
                d.positions.add_(1)
                d.context_lens.add_(1)
            page = d.block_tables.gather(1, (d.positions // bs)[:, None]).squeeze(1).long()
            d.slot_mapping.copy_(page * bs + d.positions % bs)
            tok, lp, ok = sample_with_log_probs(forward(), params, self.generator, self.calculate_log_probs)
            toks[:, j] = tok
            if lps is not None and lp is not None:
                lps[:, j] = lp
            finite &= ok
        return Burst(out, k, toks, *self._to_host(toks, lps, finite))

    def _assemble(self, prompts: Batch, seqs: list[Sequence]) -> Batch:
        """The output batch; ``seqs[i]`` is row ``i``."""
        resp = right_padded([s.output_ids for s in seqs], self.pad_id, np.int64)
        out = assemble(prompts, torch.from_numpy(resp), [] if self.ignore_eos else self.eos_ids, self.pad_id)
        if self.calculate_log_probs:
            lp = torch.from_numpy(right_padded([s.output_log_probs for s in seqs], 0.0, np.float32))
            out["rollout_log_probs"] = lp * out["response_mask"]
        return out

    def metrics(self) -> dict[str, float]:
        """Of the last ``generate``: output tokens/s, mean sequences sampled per engine step over
        ``max_num_seqs``, preemptions, peak fraction of KV blocks in use, blocks shared by prefix,
        and the seconds spent generating, waking (cache + graphs) and sleeping.  ``gen_s`` splits
        into ``mixed_step_s`` (steps with prefill), ``decode_s`` (pure-decode bursts, over
        ``decode_steps`` steps in ``decode_bursts`` bursts, ``overlapped_bursts`` of them launched
        before the one before was read; ``overlapped_mixed_steps``: steps launched before a mixed
        step before them was read) and ``host_s`` (what is left: each step's time includes its own
        scheduling and bookkeeping); ``graph_capture_s`` is
        this call's CUDA-graph capture time (graphs are captured on first use, inside ``decode_s``)."""
        return dict(self._last_metrics)

    @classmethod
    def from_config(
        cls, module: torch.nn.Module, eos_ids: list[int], pad_id: int, device: torch.device,
        autocast_dtype: torch.dtype | None, rollout_cfg: Any,
    ) -> NativeRollout:
        """Reads ``rollout.{max_num_seqs, max_num_batched_tokens, enable_prefix_caching,
        gpu_memory_utilization, enforce_eager, cudagraph_capture_sizes, free_cache_engine,
        calculate_log_probs, ignore_eos, tensor_model_parallel_size}``; with ``rollout.name=native``
        and ``tensor_model_parallel_size > 1`` it creates the TP groups (a collective: every rank
        calls it) and shards ``module`` in place.  Raises ConfigError for a model the runner does
        not reproduce, or a TP size that does not divide the world or the model's heads."""
        why = unsupported_reason(module)
        if why is not None:
            raise ConfigError(f"actor_rollout_ref.rollout.name=native: {why}. Use actor_rollout_ref.rollout.name=hf")
        tp = None
        # verl's vllm/sglang names reach here too, with verl's default size 2: they run with 1
        # (rlforge.config.later_work warns); an explicit name=native with a size > 1 is tensor parallel
        if int(rollout_cfg.tensor_model_parallel_size) > 1 and getattr(rollout_cfg, "name", "native") == "native":
            size = int(rollout_cfg.tensor_model_parallel_size)
            spec = ModelSpec.from_module(module)
            check_tp_size(size, spec.num_heads, spec.num_kv_heads, spmd_world())
            tp = new_tp_group(size)
        sizes = rollout_cfg.cudagraph_capture_sizes
        return cls(
            module, eos_ids, pad_id, device, autocast_dtype=autocast_dtype,
            max_num_seqs=int(rollout_cfg.max_num_seqs), max_num_batched_tokens=int(rollout_cfg.max_num_batched_tokens),
            enable_prefix_caching=bool(rollout_cfg.enable_prefix_caching),
            gpu_memory_utilization=float(rollout_cfg.gpu_memory_utilization) if device.type == "cuda" else None,
            enforce_eager=bool(rollout_cfg.enforce_eager),
            cudagraph_capture_sizes=[int(x) for x in sizes] if sizes else None,
            free_cache_engine=bool(rollout_cfg.free_cache_engine),
            calculate_log_probs=bool(rollout_cfg.calculate_log_probs),
            ignore_eos=bool(rollout_cfg.ignore_eos), tp=tp,
        )


def spmd_world() -> int:
    """The number of processes of this run (1 without a process group)."""
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def _elapsed(t0: float, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0

"""``NativeRollout``: the engine loop ``schedule() -> run() -> update()`` behind :class:`Rollout`.

Each ``generate`` call builds a fresh KV cache and block manager (released at the end, so
the memory is free for training between rollouts), turns every row of the left-padded
prompt batch into a :class:`Sequence`, and loops until all finish.  Weights are read from
the actor's module in place at every step: nothing is copied, nothing to sync.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from rlforge.batch import Batch
from rlforge.rollout.base import ROLLOUTS, Rollout, SamplingParams, assemble
from rlforge.rollout.native.block_manager import BlockManager, BlockManagerStats
from rlforge.rollout.native.kv_cache import KVCache
from rlforge.rollout.native.model_runner import ModelRunner, ModelSpec, prepare_inputs
from rlforge.rollout.native.sampler import sample
from rlforge.rollout.native.scheduler import Scheduler, SchedulerConfig
from rlforge.rollout.native.sequence import Sequence


@ROLLOUTS.register("native")
class NativeRollout(Rollout):
    """Paged-KV continuous-batching generation on the actor's own module.

    Args (beyond :class:`~rlforge.rollout.hf.HFRollout`'s):
        block_size: tokens per KV block.
        num_blocks: KV blocks in the cache; None = from ``kv_cache_memory_fraction`` of free
            CUDA memory, or (CPU, or no fraction) enough for every row at full length.
        kv_cache_memory_fraction: fraction of free device memory for the cache (CUDA only).
        max_num_seqs: sequences per step.
        max_num_batched_tokens: tokens per step (prefill chunk budget).
        enable_prefix_caching: share full prompt blocks between rows with the same prompt.
        seed: seed of the sampler's generator; None = torch's global RNG.
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
        kv_cache_memory_fraction: float | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 8192,
        enable_prefix_caching: bool = True,
        seed: int | None = None,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"rollout block_size must be >= 1, got {block_size}")
        if num_blocks is not None and num_blocks < 1:
            raise ValueError(f"rollout num_blocks must be >= 1 or None, got {num_blocks}")
        self.module = module
        self.eos_ids = list(eos_ids)
        self.pad_id = pad_id
        self.device = torch.device(device)
        self.autocast_dtype = autocast_dtype
        self.micro_batch_size = micro_batch_size  # unused: the scheduler batches; kept for the shared signature
        self.progress = progress
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_cache_memory_fraction = kv_cache_memory_fraction
        self.scheduler_config = SchedulerConfig(max_num_seqs, max_num_batched_tokens)
        self.enable_prefix_caching = enable_prefix_caching
        self.generator = None if seed is None else torch.Generator(self.device).manual_seed(seed)
        self.last_stats: BlockManagerStats | None = None
        self.last_num_preemptions = 0
        self._last_metrics: dict[str, float] = {}

    def _cache_dtype(self) -> torch.dtype:
        return self.autocast_dtype or next(self.module.parameters()).dtype

    def _num_blocks(self, seqs: list[Sequence], spec: ModelSpec) -> int:
        if self.num_blocks is not None:
            return self.num_blocks
        if self.kv_cache_memory_fraction is not None and self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            per = KVCache.bytes_per_block(spec.num_layers, self.block_size, spec.num_kv_heads, spec.head_dim,
                                          self._cache_dtype())
            return max(1, int(free * self.kv_cache_memory_fraction) // per)
        return sum(-(-s.max_len // self.block_size) for s in seqs)

    @torch.no_grad()
    def generate(self, prompts: Batch, params: SamplingParams) -> Batch:
        ids, mask = prompts["input_ids"], prompts["attention_mask"].bool()
        seqs = [
            Sequence(i, ids[i][mask[i]].tolist(), params.max_new_tokens) for i in range(len(prompts))
        ]
        spec = ModelSpec.from_module(self.module)
        bm = BlockManager(self._num_blocks(seqs, spec), self.block_size, self.enable_prefix_caching)
        sched = Scheduler(self.scheduler_config, bm, frozenset(self.eos_ids))
        for s in seqs:
            sched.add(s)
        cache = KVCache.allocate(spec.num_layers, bm.num_blocks, self.block_size, spec.num_kv_heads,
                                 spec.head_dim, self._cache_dtype(), self.device)
        runner = ModelRunner(self.module, cache)
        bar = tqdm(total=len(seqs) * params.max_new_tokens, desc="gen", unit="tok", leave=False,
                   disable=not self.progress)
        steps = sampled = 0
        t0 = time.perf_counter()
        try:
            with torch.autocast(self.device.type, dtype=self.autocast_dtype or torch.float32,
                                enabled=self.autocast_dtype is not None):
                while sched.has_unfinished:
                    out = sched.schedule()
                    inp = prepare_inputs(out, self.block_size, self.device)
                    logits = runner.run(inp)  # always run: a prefill chunk writes K/V even with nothing to sample
                    toks = sample(logits, params, self.generator).tolist() if inp.sample_rows else []
                    sched.update(out, dict(zip(inp.sample_seq_ids, toks, strict=True)))
                    bar.update(len(toks))
                    steps += 1
                    sampled += len(toks)
        finally:
            bar.close()
            del cache, runner
        elapsed = time.perf_counter() - t0
        self.last_stats, self.last_num_preemptions = bm.stats, sched.num_preemptions
        self._last_metrics = {
            "rollout/output_tokens_per_s": sampled / max(elapsed, 1e-9),
            "rollout/batch_occupancy": sampled / max(steps, 1) / self.scheduler_config.max_num_seqs,
            "rollout/num_preemptions": float(sched.num_preemptions),
            "rollout/kv_cache_peak_usage": bm.stats.peak_blocks_in_use / max(bm.num_blocks, 1),
            "rollout/prefix_hit_blocks": float(bm.stats.prefix_hit_blocks),
        }
        width = max(len(s.output_ids) for s in seqs)
        resp = torch.full((len(seqs), width), self.pad_id, dtype=torch.long)
        for s in seqs:
            resp[s.seq_id, : len(s.output_ids)] = torch.tensor(s.output_ids, dtype=torch.long)
        return assemble(prompts, resp, self.eos_ids, self.pad_id)

    def metrics(self) -> dict[str, float]:
        """Of the last ``generate``: output tokens/s, mean sequences sampled per engine step over
        ``max_num_seqs``, preemptions, peak fraction of KV blocks in use, blocks shared by prefix."""
        return dict(self._last_metrics)

    @classmethod
    def from_config(
        cls, module: torch.nn.Module, eos_ids: list[int], pad_id: int, device: torch.device,
        autocast_dtype: torch.dtype | None, rollout_cfg: Any,
    ) -> NativeRollout:
        """``rollout.{max_num_seqs, max_num_batched_tokens, enable_prefix_caching, gpu_memory_utilization}``;
        the KV cache takes ``gpu_memory_utilization`` of free device memory on CUDA, and is sized
        for every row at full length on the CPU."""
        return cls(
            module, eos_ids, pad_id, device, autocast_dtype=autocast_dtype,
            max_num_seqs=int(rollout_cfg.max_num_seqs), max_num_batched_tokens=int(rollout_cfg.max_num_batched_tokens),
            enable_prefix_caching=bool(rollout_cfg.enable_prefix_caching),
            kv_cache_memory_fraction=float(rollout_cfg.gpu_memory_utilization) if device.type == "cuda" else None,
        )

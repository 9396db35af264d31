"""``rollout.name=native``: a paged-KV, continuous-batching generation engine (nano-vllm / vLLM v1 shape).

Files read as the architecture: :mod:`sequence` (per-request state), :mod:`block_manager`
(paged KV bookkeeping with prefix sharing), :mod:`kv_cache` (the cache tensors),
:mod:`scheduler` (continuous batching, chunked prefill, preemption by recompute),
:mod:`model_runner` (an explicit Llama/Qwen2 forward over the paged cache),
:mod:`sampler` and :mod:`engine` (the :class:`~rlforge.rollout.base.Rollout`).
"""

from rlforge.rollout.native.engine import NativeRollout

__all__ = ["NativeRollout"]

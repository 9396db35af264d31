"""Performance measurement: stage timers (``timer``), FLOPs/MFU (``flops``), memory (``memory``),
the NVML GPU sampler (``gpu_sampler``), the stage timeline and its Chrome/Perfetto trace
(``trace``), their per-rank owner in the trainer (``monitor``), and ``rlforge perf report``
(``report``, ``plots``)."""

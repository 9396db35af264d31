#!/usr/bin/env bash
# Issue 39 on the device machine: the tuner's rows of e2e_grpo.py (as a user runs it: every lever auto) beside
# verl's defaults and the hand-tuned setting, its memory model against the runs, the planner's time, and the
# CUDA tests of param_offload. Run from the repository root:
#
#   bash benchmarks/plans/tune_plan.sh start "STEP STEP ..." [WAIT_S]   # detached; steps: cuda auto05 mem plan auto15
#                                                                         backoff auto05a auto15r auto7 shape3 probe7
#                                                                         rolltp1 ckpt3 prof05 tail
#   bash benchmarks/plans/tune_plan.sh wait [WAIT_S]                     # later calls: wait, collect
# Logs go to /tmp/tplan and are copied to $OUT when the call returns.
#
# What is still unmeasured, in the order to run it (estimated minutes on one H200; a lease gives about 25):
#   rolltp1 (4)  issue 40: the rollout at TP=1 through the tensor-parallel code, against .oldtree
#   auto15r (6, REPS15=1)  auto7 (9)  mem (<1)  probe7 (3)   issue 39: 1.5B and 7B, the memory model, the probe
#   prof05 (3)   issue 39: where the 0.5B step idles (GPU busy 89.3% against the 90% asked)
#   shape3 (8, SETUPS3=rlforge,rlforge-auto: the hand setting does not fit 3B)  ckpt3 (6)  backoff (2)
#   tail (16 with REPSTAIL=1)  issue 41: partial rollout against synchronous, long-tail and fixed lengths
# nvidia-h200 needs needs_h200=true for auto15r, auto7 and shape3 (the hand rows peak at 88-104 GB).
#
# Needs, carried: .whl/ (omegaconf, antlr4-python3-runtime, tensordict, pyvers, gguf, liger-kernel) and .tok/
# (a saved tokenizer).
set -u
REPO=$PWD
OUT=${OUT:-/tmp/out}
P=/tmp/tplan
mkdir -p "$OUT" "$P"
cmd=${1:-wait}
if [ "$cmd" = start ]; then  # relaunch this script detached, so the steps outlive one call
  rm -f "$P"/*; setsid nohup bash "$0" run "${2:-cuda auto05 mem plan}" > "$P/plan.log" 2>&1 < /dev/null &
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

E2E="python3 benchmarks/e2e_grpo.py --tokenizer .tok --skip-trl --rlforge-setups rlforge,rlforge-hand,rlforge-auto"
step_cuda() {  # param_offload in verl's meaning on CUDA, and the engine's CUDA tests
  timeout -k 5 ${CUDA_LIMIT:-240} $PYTEST tests/engine/test_param_offload.py tests/engine/test_engine_cuda.py \
    > "$OUT/cuda.txt" 2>&1
}
step_auto05() {  # 0.5B: verl's defaults, hand-tuned, auto; 5 measured steps after 1 warm-up, 3 repetitions
  timeout -k 5 ${AUTO_LIMIT:-1500} $E2E --models qwen2.5-0.5b --reps ${REPS:-3} --out /tmp/e2e05 > "$OUT/auto05.txt" 2>&1
  cp /tmp/e2e05/*.md /tmp/e2e05/*.json "$OUT"/ 2>/dev/null
  grep -h -A25 "rlforge tune\|levers" /tmp/e2e05/rlforge-auto_*.log 2>/dev/null | head -60 > "$OUT/auto05_table.txt"
}
step_mem() {  # the memory model against each auto run's perf/max_memory_allocated_gb/<stage>
  local d
  for d in /tmp/e2e05/rep*/rlforge-auto_* /tmp/e2e05/rep*/rlforge-hand_* /tmp/e2e15/rep*/rlforge-*_* /tmp/e2e7/rep*/rlforge-*_* /tmp/e2e3/rep*/rlforge-*_*; do
    [ -d "$d" ] || continue
    echo "== $d" >> "$OUT/mem.txt"; timeout -k 5 60 python3 -m rlforge.cli tune --check-memory "$d" >> "$OUT/mem.txt" 2>&1
  done
}
step_plan() {  # the planner on this GPU (its time printed), and the 8-GPU layout for 7B
  local w="algorithm.adv_estimator=grpo actor_rollout_ref.actor.strategy=fsdp2 data.train_batch_size=64 \
actor_rollout_ref.rollout.n=8 data.max_prompt_length=256 data.max_response_length=1024 \
actor_rollout_ref.actor.ppo_mini_batch_size=64 actor_rollout_ref.rollout.name=native"
  { t=$SECONDS; python3 -m rlforge.cli tune --job none actor_rollout_ref.model.path=preset:qwen2.5-7b $w
    echo "plan 7B: $((SECONDS - t)) s (the whole command)"
    python3 -m rlforge.cli tune --job none --gpus 8 actor_rollout_ref.model.path=preset:qwen2.5-7b $w; } > "$OUT/plan.txt" 2>&1
}
step_auto15() {  # 1.5B: hand-tuned and auto, one repetition each (budget)
  timeout -k 5 ${AUTO15_LIMIT:-900} python3 benchmarks/e2e_grpo.py --tokenizer .tok --skip-trl --models qwen2.5-1.5b \
    --rlforge-setups rlforge-hand,rlforge-auto --reps 1 --out /tmp/e2e15 > "$OUT/auto15.txt" 2>&1
  cp /tmp/e2e15/*.md "$OUT"/auto15.md 2>/dev/null
}
step_backoff() {  # the online back-off on a real CUDA out-of-memory error
  timeout -k 5 ${BACKOFF_LIMIT:-180} $PYTEST tests/trainer/test_backoff_cuda.py > "$OUT/backoff.txt" 2>&1
}
step_auto05a() {  # 0.5B as a user runs it (GPU busy over the step), 3 repetitions
  timeout -k 5 ${AUTO05A_LIMIT:-420} python3 benchmarks/e2e_grpo.py --tokenizer .tok --skip-trl --models qwen2.5-0.5b \
    --rlforge-setups ${SETUPS05:-rlforge-auto} --reps ${REPS05:-3} --out /tmp/e2e05 > "$OUT/auto05a.txt" 2>&1
  cp /tmp/e2e05/*.md "$OUT"/auto05a.md 2>/dev/null
}
step_auto15r() {  # 1.5B: hand-tuned and auto, interleaved repetitions
  timeout -k 5 ${AUTO15_LIMIT:-900} python3 benchmarks/e2e_grpo.py --tokenizer .tok --skip-trl --models qwen2.5-1.5b \
    --rlforge-setups rlforge-hand,rlforge-auto --reps ${REPS15:-2} --out /tmp/e2e15 > "$OUT/auto15.txt" 2>&1
  cp /tmp/e2e15/*.md "$OUT"/auto15.md 2>/dev/null
  grep -h -A22 "rlforge tune" /tmp/e2e15/rep1/rlforge-auto_*.log 2>/dev/null | head -30 > "$OUT/auto15_table.txt"
}
step_auto7() {  # 7B, 32 x 8, 256 + 512: the hand setting (optimizer offload) and auto
  timeout -k 5 ${AUTO7_LIMIT:-900} python3 benchmarks/e2e_grpo.py --tokenizer .tok --skip-trl --models qwen2.5-7b \
    --prompts 32 --response-len 512 --rlforge-setups rlforge,rlforge-auto --reps ${REPS7:-1} \
    --rlforge-extra actor_rollout_ref.actor.fsdp_config.optimizer_offload=true --out /tmp/e2e7 > "$OUT/auto7.txt" 2>&1
  cp /tmp/e2e7/*.md "$OUT"/auto7.md 2>/dev/null
  grep -h -A22 "rlforge tune" /tmp/e2e7/rep1/rlforge-auto_*.log 2>/dev/null | head -30 > "$OUT/auto7_table.txt"
}
step_shape3() {  # a shape nothing was tuned on: 3B, responses of up to 768 tokens
  timeout -k 5 ${SHAPE3_LIMIT:-700} python3 benchmarks/e2e_grpo.py --tokenizer .tok --skip-trl --models qwen2.5-3b \
    --response-len 768 --rlforge-setups ${SETUPS3:-rlforge-hand,rlforge-auto} --reps ${REPS3:-1} --out /tmp/e2e3 > "$OUT/shape3.txt" 2>&1
  cp /tmp/e2e3/*.md "$OUT"/shape3.md 2>/dev/null
  grep -h -A22 "rlforge tune" /tmp/e2e3/rep1/rlforge-auto_*.log 2>/dev/null | head -30 > "$OUT/shape3_table.txt"
}
step_probe7() {  # the in-process probe on 7B (issue 39: at most 60 s, printed): build once, measure the best three
  local w="actor_rollout_ref.model.path=preset:qwen2.5-7b actor_rollout_ref.model.tokenizer_path=.tok \
data.train_files=builtin:arithmetic data.val_files=null data.train_batch_size=32 actor_rollout_ref.rollout.n=8 \
data.max_prompt_length=256 data.max_response_length=512 actor_rollout_ref.actor.ppo_mini_batch_size=32 \
algorithm.adv_estimator=grpo actor_rollout_ref.actor.strategy=fsdp2 actor_rollout_ref.rollout.name=native \
actor_rollout_ref.rollout.tensor_model_parallel_size=1"
  { t=$SECONDS; timeout -k 5 ${PROBE7_LIMIT:-900} python3 -m rlforge.cli tune --probe --job none $w
    echo "probe7 rc=$?: $((SECONDS - t)) s (the whole command: device benchmark, model build, probe)"; } > "$OUT/probe7.txt" 2>&1
  grep -h "probed .* candidates in\|built the job\|<- chosen\|warning" "$OUT/probe7.txt" > "$OUT/probe7_time.txt"
}
step_rolltp1() {  # issue 40: the rollout at TP=1 through the tensor-parallel code against the tree before it
  # (.oldtree: `git archive 68f84b0 rlforge benchmarks`, carried); interleaved, 0.5B random x1024, warm engine
  local t r
  for r in 1 2; do for t in old new; do
    local root=$REPO; [ $t = old ] && root=$REPO/.oldtree
    echo "== $t rep $r" >> "$OUT/rolltp1.txt"
    PYTHONPATH=/tmp/site:$root timeout -k 5 ${ROLLTP1_LIMIT:-200} python3 $root/benchmarks/rollout_throughput.py \
      --models qwen2.5-0.5b --workloads random --skip-grpo --hf-models --variants triton-graph-warm --native-reps 3 \
      --max-num-batched-tokens 32768 --json /tmp/rolltp1_${t}_$r.json >> "$OUT/rolltp1.txt" 2>&1
  done; done
  cp /tmp/rolltp1_*.json "$OUT"/ 2>/dev/null
}
step_prof05() {  # 0.5B as a user runs it under torch.profiler: where the GPU idles within the step (issue 39's 90%)
  timeout -k 5 ${PROF05_LIMIT:-300} python3 benchmarks/e2e_grpo.py --tokenizer .tok --skip-trl --models qwen2.5-0.5b \
    --rlforge-setups rlforge-auto --reps 1 --steps 3 --profile --out /tmp/e2ep > "$OUT/prof05.txt" 2>&1
  cp /tmp/e2ep/*.md "$OUT"/prof05.md 2>/dev/null
}
step_tail() {  # issue 41: partial rollout against the synchronous trainer, as a user runs both (every lever auto),
  # on the long-tail workload and the fixed-length one; interleaved repetitions, the same weights
  local lw
  for lw in ${TAIL_LENGTHS:-lognormal fixed}; do
    timeout -k 5 ${TAIL_LIMIT:-$((600 * ${REPSTAIL:-2}))} python3 benchmarks/e2e_grpo.py --tokenizer .tok --skip-trl \
      --models ${TAIL_MODELS:-qwen2.5-0.5b qwen2.5-1.5b} --lengths $lw --rlforge-setups rlforge-auto,rlforge-auto-partial \
      --reps ${REPSTAIL:-2} --out /tmp/tail_$lw > "$OUT/tail_$lw.txt" 2>&1
    cp /tmp/tail_$lw/*.md "$OUT"/tail_$lw.md 2>/dev/null
  done
}
step_ckpt3() {  # issue 40: checkpoint save cost, full-state against DCP (sync, async), 3B full fine-tuning
  # (7B's 91 GB per checkpoint does not fit this machine's 64 GiB disk; each row's folder is removed after it)
  df -h /tmp > "$OUT/ckpt3.txt" 2>&1
  timeout -k 5 ${CKPT3_LIMIT:-400} python3 benchmarks/checkpoint_save.py --model ${CKPT_MODEL:-qwen2.5-3b} \
    --out /tmp/ckpt-bench >> "$OUT/ckpt3.txt" 2>&1
}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
for s in ${2:-cuda auto05 mem plan}; do
  t0=$SECONDS; "step_$s"; echo "step $s: rc=$? $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
done
touch "$P/done"

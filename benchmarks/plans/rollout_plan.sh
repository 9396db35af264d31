#!/usr/bin/env bash
# Issue 17's rollout measurements in one lease of the device machine, detached so that they outlive
# one call's 10-minute limit.  Run from the repository root, as the device tool runs commands
# ($OUT: the folder whose files come back).  About 22 minutes on one H200 (nvidia-h200), all steps.
#
#   bash benchmarks/plans/rollout_plan.sh start [STEPS] [WAIT_S]   # first call: start detached, wait, collect
#   bash benchmarks/plans/rollout_plan.sh wait [WAIT_S]            # later calls (within the machine's warm window)
#
# STEPS (quoted, space-separated; default all, in this order; each has its own time limit):
#   tests     (~2 min)  CUDA tests: split-KV decode (test_split_kv_cuda.py), the native engine, fused kernels
#   kernels   (~3 min)  rollout_throughput --kernels: decode attention unsplit / split / auto at B=1,16,64 x 8k
#                       and B=1024 x 512, whole decode steps at B=1,16,64 x 8k (0.5B, 7B) against their floors
#   random    (~11 min) 0.5B random x1024 (and grpo): every transformers setup (generate, the old call, its two
#                       halves, static cache + compile, continuous batching x3) beside the native engine
#   longtail  (~4 min)  0.5B long-tail workload (mean 500, p99 3000, max 4096, 512 prompts): generate, static
#                       cache + compile, continuous batching, native
#   prof      (~2 min)  --step-profile: whole captured decode steps (0.5B, 7B at B=1,16,64 x 8k), kernels per step
#   base      (~9 min)  0.5B random x1024 and long tail: native beside generate (batch 1024) and continuous batching
#   diag      (~6 min)  hf_baseline_check.py (generate and continuous batching in a fresh process, then after a
#                       native run), the decode-attention launch sweep, decode steps at B=256 and 1024 x 512
#   fair      (~8 min)  0.5B random x1024: native (median of 3 runs) beside generate at batch 1024 (whole-call
#                       warm-up) and continuous batching (default, CUDA graphs forced, + compile) on its first
#                       128 prompts; the long tail, native only (median of 3)
#   burst     (~5 min)  native only, median of 3: decode steps between host reads 16 / 32 / 64 (default) / 128
#                       on 0.5B random x1024 and long tail, and 7B random x1024 at max_num_seqs 256 and 1024
#   fair2     (~2 min)  0.5B random x1024, default burst: native (median of 3) beside warm generate at 512 and 1024
#   lt        (~7 min)  0.5B long tail in one run: native (median of 3), continuous batching (all 512), generate
#                       (60 s after a 60 s warm-up of the same call)
#   lt128     (~5 min)  the same on 128 long-tail prompts (continuous batching did not finish 512 in 7 minutes)
#   lt128g    (~3 min)  lt128's generate row beside native (60 s of generate after a 60 s warm-up)
#   e2etrl    (~7 min)  e2e_grpo 0.5B, small workload (8 prompts x 8, 128 + 128 tokens), rlforge beside trl-fast
#                       and trl-cb, 3 interleaved repetitions
#   sampler   (~1 min)  benchmarks/sampler_bench.py: the sampler beside its previous version (.old/triton_sampler.py)
#   fair3     (~5 min)  0.5B random x1024: native per-run engine and warm engine (median of 3) beside warm generate;
#                       captured decode steps at B=16 x 8k and 1024 x 512
#   fair4     (~6 min)  fair3's random x1024 rows with the default allocator, then with expandable segments
#   check     (~8 min)  7B random x1024 and the long tail on this tree; token budgets 32k/64k; a run's profile
#   final     (~6 min)  at the 32k token budget: 0.5B x1024 native beside generate; 7B x1024 (median of 3)
#   big       (~2 min)  7B random x1024, native only (no transformers row: 0.5B is the baseline model)
#   ovl       (~6 min)  overlapped steps: 0.5B x1024 warm engine serial / overlapped, new engine overlapped (median
#                       of 3) beside warm generate; the long tail serial / overlapped (median of 3)
#   ovl2      (~4 min)  the warm x1024 rows again (serial, overlapped) beside warm generate; profiles of a warm run
#   ovl3      (~3 min)  ovl2's x1024 rows only
#   ssweep    (~1 min)  benchmarks/sampler_bench.py --sweep: the sampler's tile size x warps at B=256 and 1024
#   ovl7b     (~4 min)  7B random x1024 at max_num_seqs 1024 and 256, median of 3, overlapped steps on
# Every call waits until the plan is done or WAIT_S (default 570) seconds have passed, then copies what is
# written so far into $OUT/rollout_plan.tgz and prints each log's table.  A failing row prints 'failed: reason';
# a step stopped by its time limit prints the table of the rows it measured.
# Needs, carried with the call: .whl/ (omegaconf, antlr4, tensordict, pyvers) and .tok/ (a tokenizer folder).
set -u
P=/tmp/rplan
REPO=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$P"
cmd=${1:-wait}
RT="$REPO/benchmarks/rollout_throughput.py"

setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$REPO"/.whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 RLFORGE_TEST_TOKENIZER=$REPO/.tok
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

step_tests() {
  timeout -k 5 300 python3 -m pytest -n 0 -p no:cacheprovider tests/rollout/test_split_kv_cuda.py \
    tests/rollout/test_split_kv.py tests/rollout/test_native_cuda.py tests/rollout/test_triton_fused.py \
    tests/rollout/test_triton_sampler.py tests/engine/test_prefix_grouper.py \
    > "$P/tests.txt" 2>&1
}
step_kernels() {
  timeout -k 5 420 python3 "$RT" --kernels > "$P/kernels.txt" 2>&1
}
step_random() {
  timeout -k 60 900 python3 "$RT" --models qwen2.5-0.5b --workloads random grpo --hf-batch 256 512 1024 \
    --hf-setups generate,generate-old,generate-mask@1024,generate-noeos@1024,cb,cb-noflash@1024,static-compile@512:1024,cb-compile@1024 \
    --variants triton-graph,triton-graph-unfused --json "$P/random.json" > "$P/random.txt" 2>&1
}
step_longtail() {
  timeout -k 60 600 python3 "$RT" --models qwen2.5-0.5b --workloads longtail \
    --longtail-hf-setups generate,static-compile,cb --hf-max-time 240 --variants triton-graph \
    --json "$P/longtail.json" > "$P/longtail.txt" 2>&1
}
step_prof() {
  timeout -k 5 300 python3 "$RT" --step-profile > "$P/prof.txt" 2>&1
}
step_base() {
  timeout -k 60 720 python3 "$RT" --models qwen2.5-0.5b --workloads random longtail --skip-grpo --hf-batch 1024 \
    --hf-setups generate,cb --longtail-hf-setups cb --hf-max-time 240 --variants triton-graph \
    --json "$P/base.json" > "$P/base.txt" 2>&1
}
step_diag() {
  timeout -k 5 300 python3 "$REPO/benchmarks/hf_baseline_check.py" --cb-prompts 128 > "$P/diag_hf.txt" 2>&1
  timeout -k 5 240 python3 "$RT" --attention-sweep > "$P/diag_attn.txt" 2>&1
  timeout -k 5 150 python3 "$RT" --step-profile --step-sizes 256 1024 > "$P/diag_steps.txt" 2>&1
}
step_fair() {
  timeout -k 30 380 python3 "$RT" --models qwen2.5-0.5b --workloads random --skip-grpo --hf-batch 1024 \
    --hf-setups generate,cb-graphs@128,cb@128,cb-graphs-compile@128 --variants triton-graph --native-reps 3 \
    --json "$P/fair.json" > "$P/fair.txt" 2>&1
  timeout -k 10 100 python3 "$RT" --models qwen2.5-0.5b --workloads longtail --skip-grpo --longtail-hf-setups "" \
    --variants triton-graph --native-reps 3 --json "$P/fair_lt.json" > "$P/fair_lt.txt" 2>&1
}
step_burst() {
  local v=triton-graph-burst16,triton-graph-burst32,triton-graph,triton-graph-burst128
  timeout -k 10 200 python3 "$RT" --models qwen2.5-0.5b --workloads random longtail --skip-grpo --hf-setups "" \
    --longtail-hf-setups "" --variants $v --native-reps 3 --json "$P/burst.json" > "$P/burst.txt" 2>&1
  timeout -k 10 240 python3 "$RT" --models qwen2.5-7b --hf-models --workloads random --big-variants \
    triton-graph-burst16,triton-graph --big-max-num-seqs 256 1024 --json "$P/burst7b.json" > "$P/burst7b.txt" 2>&1
}
step_fair2() {  # random x1024 with the default burst: native (median of 3) beside warm generate at 512 and 1024
  timeout -k 30 240 python3 "$RT" --models qwen2.5-0.5b --workloads random --skip-grpo --hf-batch 512 1024 \
    --hf-setups generate --variants triton-graph --native-reps 3 --json "$P/fair2.json" > "$P/fair2.txt" 2>&1
}
step_lt() {  # the long tail in one run: native (median of 3), continuous batching on all 512 prompts, and generate
  # for 60 s after a 60 s warm-up of the same call (its fullest steps: flatters generate)
  timeout -k 30 480 python3 "$RT" --models qwen2.5-0.5b --workloads longtail --skip-grpo --longtail-hf-setups cb,generate \
    --hf-max-time 60 --variants triton-graph --native-reps 3 --json "$P/lt.json" > "$P/lt.txt" 2>&1
}
step_lt128() {  # the long tail on 128 prompts, so that continuous batching can finish (it ran < 600 tokens/s on 512)
  timeout -k 30 420 python3 "$RT" --models qwen2.5-0.5b --workloads longtail --longtail-prompts 128 --skip-grpo \
    --longtail-hf-setups cb,generate --hf-max-time 60 --variants triton-graph --native-reps 3 \
    --json "$P/lt128.json" > "$P/lt128.txt" 2>&1
}
step_lt128g() {  # lt128's generate row alone (lt128 ran out of its limit after continuous batching's 333 s)
  timeout -k 30 400 python3 "$RT" --models qwen2.5-0.5b --workloads longtail --longtail-prompts 128 --skip-grpo \
    --longtail-hf-setups generate --hf-max-time 60 --variants triton-graph --native-reps 3 \
    --json "$P/lt128g.json" > "$P/lt128g.txt" 2>&1
}
step_e2etrl() {  # issue 17: e2e with both TRL rows, same weights, 3 interleaved repetitions (a small workload: TRL's
  # continuous batching generates at 1-2k tokens/s here)
  timeout -k 30 560 python3 "$REPO/benchmarks/e2e_grpo.py" --tokenizer "$REPO/.tok" --models qwen2.5-0.5b --prompts 8 \
    --n 8 --prompt-len 128 --response-len 128 --steps 5 --warmup 1 --reps 3 --trl-variants trl-fast,trl-cb \
    --run-time-limit 150 --token-budget 32768 --out /tmp/e2etrl --rlforge-extra actor_rollout_ref.model.use_liger=true \
    actor_rollout_ref.model.enable_gradient_checkpointing=false actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false \
    > "$P/e2etrl.txt" 2>&1
  local rc=$?
  mkdir -p "$P/e2etrl" && cp /tmp/e2etrl/e2e_grpo.* "$P/e2etrl/" 2>/dev/null
  for d in /tmp/e2etrl/rep*; do [ -d "$d" ] && mkdir -p "$P/e2etrl/${d##*/}" && cp "$d"/*.log "$P/e2etrl/${d##*/}/"; done
  return $rc
}
step_sampler() {  # the two-kernel sampler beside the one-pass Gumbel-max kernel it replaced (carried in .old/)
  timeout -k 5 120 python3 "$REPO/benchmarks/sampler_bench.py" --old "$REPO/.old/triton_sampler.py" \
    > "$P/sampler.txt" 2>&1
}
step_fair3() {  # random x1024: native on a new engine per run and on one warm engine (median of 3 each), beside
  # warm generate at 1024; then whole captured decode steps at B=16 x 8k and B=1024 x 512
  timeout -k 30 300 python3 "$RT" --models qwen2.5-0.5b --workloads random --skip-grpo --hf-batch 1024 \
    --hf-setups generate --variants triton-graph,triton-graph-warm --native-reps 3 --json "$P/fair3.json" \
    > "$P/fair3.txt" 2>&1
  timeout -k 5 120 python3 "$RT" --step-profile --step-sizes 16 1024 --kernel-step-models qwen2.5-0.5b \
    > "$P/fair3_steps.txt" 2>&1
}
step_fair4() {  # fair3 twice: the default allocator, then expandable segments (the setting that spares generate's
  # growing dynamic cache its cudaMalloc calls), each in its own process
  timeout -k 30 300 python3 "$RT" --models qwen2.5-0.5b --workloads random --skip-grpo --hf-batch 1024 \
    --hf-setups generate --variants triton-graph,triton-graph-warm --native-reps 3 --json "$P/fair4a.json" \
    > "$P/fair4a.txt" 2>&1
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True timeout -k 30 300 python3 "$RT" --models qwen2.5-0.5b \
    --workloads random --skip-grpo --hf-batch 1024 --hf-setups generate --variants triton-graph,triton-graph-warm \
    --native-reps 3 --json "$P/fair4b.json" > "$P/fair4b.txt" 2>&1
  timeout -k 5 120 python3 "$RT" --step-profile --step-sizes 1024 --kernel-step-models qwen2.5-0.5b \
    > "$P/fair4_steps.txt" 2>&1
}
step_check() {  # the whole-run rows that issue 17's met items quote, on this tree: 7B random x1024 (combined
  # floor), the long tail (native, median of 3); then the token budget per step on 0.5B x1024 (warm engine), and
  # a device + host profile of one 0.5B x1024 run
  timeout -k 30 240 python3 "$RT" --models qwen2.5-7b --hf-models --workloads random --big-variants triton-graph \
    --big-max-num-seqs 256 1024 --json "$P/check7b.json" > "$P/check7b.txt" 2>&1
  timeout -k 10 120 python3 "$RT" --models qwen2.5-0.5b --workloads longtail --skip-grpo --longtail-hf-setups "" \
    --variants triton-graph --native-reps 3 --json "$P/check_lt.json" > "$P/check_lt.txt" 2>&1
  local n
  for n in 32768 65536; do
    timeout -k 10 90 python3 "$RT" --models qwen2.5-0.5b --workloads random --skip-grpo --hf-setups "" \
      --variants triton-graph-warm --native-reps 3 --max-num-batched-tokens $n > "$P/check_mbt$n.txt" 2>&1
  done
  timeout -k 10 150 python3 "$RT" --models qwen2.5-0.5b --profile > "$P/check_prof.txt" 2>&1
}
step_final() {  # at the 32k token budget: 0.5B random x1024 native (new engine per run, warm engine; median of 3)
  # beside warm generate at 1024, then 7B random x1024 at max_num_seqs 1024 and 256 (median of 3)
  timeout -k 30 200 python3 "$RT" --models qwen2.5-0.5b --workloads random --skip-grpo --hf-batch 1024 \
    --hf-setups generate --variants triton-graph,triton-graph-warm --native-reps 3 --max-num-batched-tokens 32768 \
    --json "$P/final.json" > "$P/final.txt" 2>&1
  timeout -k 30 220 python3 "$RT" --models qwen2.5-7b --hf-models --workloads random --big-variants triton-graph \
    --big-max-num-seqs 1024 256 --native-reps 3 --max-num-batched-tokens 32768 --json "$P/final7b.json" \
    > "$P/final7b.txt" 2>&1
}
step_ovl() {  # overlapped steps (2026-12-02, 15:xx): 0.5B random x1024 at the 32k budget, warm engine with
  # overlap off (serial) and on, a new engine per run with it on (median of 3 each), beside warm generate at 1024;
  # then the long tail, native serial and overlapped (median of 3)
  timeout -k 30 260 python3 "$RT" --models qwen2.5-0.5b --workloads random --skip-grpo --hf-batch 1024 \
    --hf-setups generate --variants triton-graph-warm-serial,triton-graph-warm,triton-graph --native-reps 3 \
    --max-num-batched-tokens 32768 --json "$P/ovl.json" > "$P/ovl.txt" 2>&1
  timeout -k 10 150 python3 "$RT" --models qwen2.5-0.5b --workloads longtail --skip-grpo --longtail-hf-setups "" \
    --variants triton-graph-serial,triton-graph --native-reps 3 --json "$P/ovl_lt.json" > "$P/ovl_lt.txt" 2>&1
}
step_ovl2() {  # after the host trims (prompt and response copies, lazy KV blocks): the warm rows again beside
  # warm generate (median of 3), then host and device profiles of one warm run
  timeout -k 30 200 python3 "$RT" --models qwen2.5-0.5b --workloads random --skip-grpo --hf-batch 1024 \
    --hf-setups generate --variants triton-graph-warm-serial,triton-graph-warm --native-reps 3 \
    --max-num-batched-tokens 32768 --json "$P/ovl2.json" > "$P/ovl2.txt" 2>&1
  timeout -k 10 150 python3 "$RT" --models qwen2.5-0.5b --profile --profile-warm --max-num-batched-tokens 32768 \
    > "$P/ovl2_prof.txt" 2>&1
}
step_ovl3() {  # ovl2's rows only (no profiles), after the index copies stopped waiting for the stream
  timeout -k 30 200 python3 "$RT" --models qwen2.5-0.5b --workloads random --skip-grpo --hf-batch 1024 \
    --hf-setups generate --variants triton-graph-warm-serial,triton-graph-warm --native-reps 3 \
    --max-num-batched-tokens 32768 --json "$P/ovl3.json" > "$P/ovl3.txt" 2>&1
}
step_ssweep() {  # the sampler's vocabulary tile x warps of its per-tile kernel at B=256 and 1024
  timeout -k 5 120 python3 benchmarks/sampler_bench.py --sweep --batch 256 1024 > "$P/ssweep.txt" 2>&1
}
step_ovl7b() {  # the 7B whole-run rows (median of 3) at max_num_seqs 1024 and 256, overlapped steps on
  timeout -k 30 220 python3 "$RT" --models qwen2.5-7b --hf-models --workloads random --big-variants triton-graph \
    --big-max-num-seqs 1024 256 --native-reps 3 --max-num-batched-tokens 32768 --json "$P/ovl7b.json" \
    > "$P/ovl7b.txt" 2>&1
}
step_big() {
  timeout -k 60 300 python3 "$RT" --models qwen2.5-7b --hf-models --workloads random --big-variants triton-graph \
    --big-max-num-seqs 256 1024 --json "$P/big.json" > "$P/big.txt" 2>&1
}

plan() {
  setup
  mark() { date -u +"$1 %T" >> "$P/progress.txt"; }
  mark "start $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  cd "$REPO" || return
  for s in ${STEPS:-tests kernels random longtail big}; do
    "step_$s"
    mark "$s rc=$?"
  done
  touch "$P/done"
}

collect() {
  (cd /tmp && tar czf "$OUT/rollout_plan.tgz" rplan)
  cat "$P/progress.txt" 2>/dev/null
  for f in "$P"/*.txt; do
    [ -f "$f" ] && [ "$(basename "$f")" != progress.txt ] || continue
    echo "=== $f"
    if grep -q "^| " "$f"; then grep "^| \|^###\|^device\|failed\|passed\|error" "$f" | cut -c1-260 | tail -120
    else tail -15 "$f" | cut -c1-260; fi
  done
}

case "$cmd" in
  run) plan; exit 0 ;;
  start)
    rm -rf "$P" && mkdir -p "$P"
    STEPS=${2:-tests kernels random longtail big} setsid nohup bash "$REPO/benchmarks/plans/rollout_plan.sh" run \
      > "$P/plan.log" 2>&1 < /dev/null &
    WAIT=${3:-570}
    ;;
  wait) WAIT=${2:-570} ;;
  *) echo "usage: $0 start [STEPS] [WAIT_S] | wait [WAIT_S]" >&2; exit 2 ;;
esac
end=$((SECONDS + WAIT))
while [ ! -f "$P/done" ] && [ $SECONDS -lt $end ]; do sleep 5; done
collect

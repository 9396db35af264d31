#!/usr/bin/env bash
# Training-engine measurements (issue 15) in one lease of the device machine, detached so that they
# outlive one call's 10-minute limit.  Run from the repository root, as the device tool runs commands.
#
#   bash benchmarks/plans/engine_plan.sh start "STEP STEP ..." [WAIT_S]   # start detached, wait, collect
#   bash benchmarks/plans/engine_plan.sh wait [WAIT_S]                     # later calls: wait, collect
#
# Steps (each with its own time limit): tests (CUDA engine + rollout tests), train (train_throughput
# rows on 1.5B and 0.5B), offload (1.5B: checkpointing with and without activation offload), offprof (profile of checkpointing + activation offload on 1.5B), e7b (7B GRPO,
# 3 measured steps, rlforge), e2e (e2e_grpo 0.5B and 1.5B, rlforge beside TRL, 5 measured steps; E2E_MODELS,
# E2E_ARGS), head (Triton LM-head chunk kernels: CUDA tests, head_bench.py), tph (train_throughput rows with
# torch vs Triton head chunks), mtkv (multi_turn_kv.py), lora05 (0.5B LoRA e2e row; LORA_ARGS), e2eprof (profile
# of rlforge's 0.5B e2e step, best settings), lora7b (7B LoRA rank 64, 3 steps), rm (reward-model CUDA tests and
# rm_throughput.py), sync (no-host-sync CUDA test; old tree in .old/ vs new, 0.5B and 1.5B updates).
# mem (allocated memory per stage and step, 0.5B e2e, 10 steps; the engine and rollout CUDA tests).
# pg (e2e_grpo, rlforge only: actor.use_prefix_grouper false / true on 0.5B and 1.5B; PG_MODELS).
# Needs, carried: .whl/ (omegaconf, tensordict, pyvers, antlr4; trl, datasets, dill, multiprocess; liger-kernel,
# which the image lacks: without it use_liger=true warns and trl-fast fails) and .tok/ (a saved tokenizer).
set -u
P=/tmp/eplan
REPO=$PWD
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$P"
cmd=${1:-wait}

setup() {
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$REPO"/.whl/*.whl >/dev/null 2>&1
  export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1 RLFORGE_TEST_TOKENIZER=$REPO/.tok
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

TT="$REPO/benchmarks/train_throughput.py"
step_tests() {
  timeout -k 5 240 python3 -m pytest -n 0 -p no:cacheprovider tests/engine/test_engine_cuda.py \
    > "$P/tests.txt" 2>&1
}
step_train() {
  timeout -k 10 330 python3 "$TT" --model qwen2.5-1.5b --tokenizer "$REPO/.tok" --head chunked --iters 3 \
    --rows dyn,fsdp2-dyn,fsdp2-dyn-compile,fsdp2-dyn-ckpt,fsdp2-dyn-ckpt-compile,fsdp2-dyn-ckpt-offload-compile \
    > "$P/train15.txt" 2>&1
  timeout -k 10 200 python3 "$TT" --model qwen2.5-0.5b --tokenizer "$REPO/.tok" --head chunked --iters 3 \
    --rows fsdp2-dyn-ckpt,fsdp2-dyn-ckpt-compile > "$P/train05.txt" 2>&1
}
step_offload() {
  timeout -k 10 200 python3 "$TT" --model qwen2.5-1.5b --tokenizer "$REPO/.tok" --head chunked --iters 3 \
    --rows fsdp2-dyn-ckpt,fsdp2-dyn-ckpt-offload,fsdp2-dyn > "$P/offload15.txt" 2>&1
}
step_offprof() {
  timeout -k 10 150 python3 "$TT" --model qwen2.5-1.5b --tokenizer "$REPO/.tok" --head chunked --iters 1 \
    --rows fsdp2-dyn-ckpt-offload --profile > "$P/offprof.txt" 2>&1
}
step_e7b() {
  timeout -k 10 900 python3 benchmarks/e2e_grpo.py --tokenizer "$REPO/.tok" --models qwen2.5-7b --skip-trl \
    --prompts 32 --n 8 --prompt-len 256 --response-len 512 --steps 3 --warmup 1 --out "$P/e7b" \
    --rlforge-extra actor_rollout_ref.actor.fsdp_config.optimizer_offload=true > "$P/e7b.txt" 2>&1
}
step_tune05() {  # 0.5B update: token budget x checkpointing, 256 sequences, then a profile
  for b in 16384 32768 65536; do
    timeout -k 10 150 python3 "$TT" --model qwen2.5-0.5b --tokenizer "$REPO/.tok" --head chunked --iters 3 \
      --seqs 256 --budget $b --rows fsdp2-dyn-ckpt,fsdp2-dyn >> "$P/tune05.txt" 2>&1
  done
  timeout -k 10 120 python3 "$TT" --model qwen2.5-0.5b --tokenizer "$REPO/.tok" --head chunked --iters 1 \
    --seqs 256 --budget 16384 --rows fsdp2-dyn-ckpt --profile > "$P/prof05.txt" 2>&1
}
step_liger() {  # liger-kernel and reshard_after_forward=false on 1.5B (64 seqs) and 0.5B (256 seqs, 64k budget)
  timeout -k 5 120 python3 -m pytest -n 0 -p no:cacheprovider tests/engine/test_engine_cuda.py -k liger \
    > "$P/liger_test.txt" 2>&1
  timeout -k 10 200 python3 "$TT" --model qwen2.5-1.5b --tokenizer "$REPO/.tok" --head chunked --iters 3 \
    --rows fsdp2-dyn,fsdp2-dyn-nrs,fsdp2-dyn-liger,fsdp2-dyn-nrs-liger > "$P/liger15.txt" 2>&1
  timeout -k 10 200 python3 "$TT" --model qwen2.5-0.5b --tokenizer "$REPO/.tok" --head chunked --iters 3 \
    --seqs 256 --budget 65536 --rows fsdp2-dyn-nrs,fsdp2-dyn-ckpt-liger,fsdp2-dyn-liger,fsdp2-dyn-nrs-liger \
    > "$P/liger05.txt" 2>&1
}
step_prof05l() {  # profile of the 0.5B update with liger + no reshard, 64k budget
  timeout -k 10 120 python3 "$TT" --model qwen2.5-0.5b --tokenizer "$REPO/.tok" --head chunked --iters 1 \
    --seqs 256 --budget 65536 --rows fsdp2-dyn-nrs-liger --profile > "$P/prof05l.txt" 2>&1
}
step_head() {  # Triton chunk kernels of the LM head: CUDA tests (+ split-KV, engine), then the head micro-benchmark
  timeout -k 5 360 python3 -m pytest -n 0 -p no:cacheprovider tests/roles/test_fused_head_cuda.py \
    tests/rollout/test_split_kv_cuda.py tests/engine/test_engine_cuda.py > "$P/head_tests.txt" 2>&1
  timeout -k 5 150 python3 benchmarks/head_bench.py > "$P/head_bench.txt" 2>&1
}
step_tph() {  # the update with torch vs Triton head chunks: 0.5B (256 seqs, 64k budget) and 1.5B (64 seqs)
  timeout -k 10 300 python3 "$TT" --model qwen2.5-0.5b --tokenizer "$REPO/.tok" --head chunked --iters 3 \
    --seqs 256 --budget 65536 \
    --rows fsdp2-dyn-nrs-torchhead,fsdp2-dyn-nrs,fsdp2-dyn-nrs-liger-torchhead,fsdp2-dyn-nrs-liger > "$P/tph05.txt" 2>&1
  timeout -k 10 240 python3 "$TT" --model qwen2.5-1.5b --tokenizer "$REPO/.tok" --head chunked --iters 3 \
    --rows fsdp2-dyn-torchhead,fsdp2-dyn,fsdp2-dyn-nrs-liger > "$P/tph15.txt" 2>&1
}
step_mtkv() {  # issue 18: multi-turn rollout, KV reuse vs re-prefill, 0.5B
  timeout -k 5 300 python3 benchmarks/multi_turn_kv.py --tokenizer "$REPO/.tok" --json "$P/mtkv.json" \
    > "$P/mtkv.txt" 2>&1
}
step_lora05() {  # issue 19: 0.5B LoRA rank 64 e2e row (rlforge only), same settings as E2E_ARGS' rlforge side
  timeout -k 10 500 python3 benchmarks/e2e_grpo.py --tokenizer "$REPO/.tok" --models qwen2.5-0.5b --skip-trl \
    --steps 5 --warmup 1 --reps 1 --out "$P/lora05" ${LORA_ARGS:-} > "$P/lora05.txt" 2>&1
}
step_e2eprof() {  # issue 15: where the 0.5B update's time goes (rlforge only, best settings, one profiled extra step)
  timeout -k 10 400 python3 benchmarks/e2e_grpo.py --tokenizer "$REPO/.tok" --models qwen2.5-0.5b --skip-trl \
    --steps 5 --warmup 1 --reps 1 --profile --token-budget 32768 --out "$P/e2eprof" --rlforge-extra \
    actor_rollout_ref.model.use_liger=true actor_rollout_ref.model.enable_gradient_checkpointing=false \
    actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false > "$P/e2eprof.txt" 2>&1
}
step_lora7b() {  # issue 19: 7B LoRA rank 64, 3 measured steps, beside the full fine-tuning run of e7b
  timeout -k 10 900 python3 benchmarks/e2e_grpo.py --tokenizer "$REPO/.tok" --models qwen2.5-7b --skip-trl \
    --prompts 32 --n 8 --prompt-len 256 --response-len 512 --steps 3 --warmup 1 --reps 1 --out "$P/lora7b" \
    --rlforge-extra actor_rollout_ref.model.lora_rank=64 actor_rollout_ref.model.lora_alpha=128 > "$P/lora7b.txt" 2>&1
}
step_rm() {  # issue 20: reward-model scoring throughput on a 1.5B-shaped model, and its CUDA tests
  timeout -k 5 200 python3 -m pytest -n 0 -p no:cacheprovider tests/rewards/test_model_reward_cuda.py > "$P/rm_tests.txt" 2>&1
  timeout -k 10 300 python3 benchmarks/rm_throughput.py > "$P/rm.txt" 2>&1
}
step_sync() {  # issue 15: staged micro-batches (no host sync in the loop): CUDA test, then old (.old/, carried) vs new
  timeout -k 5 200 python3 -m pytest -n 0 -p no:cacheprovider tests/engine/test_engine_cuda.py > "$P/sync_tests.txt" 2>&1
  for rep in 1 2; do
    for tree in old new; do
      local pp=$REPO; [ $tree = old ] && pp=$REPO/.old
      echo "## $tree rep $rep" >> "$P/sync05.txt"; echo "## $tree rep $rep" >> "$P/sync15.txt"
      PYTHONPATH=/tmp/site:$pp timeout -k 10 150 python3 "$TT" --model qwen2.5-0.5b --tokenizer "$REPO/.tok" \
        --head chunked --iters 3 --seqs 256 --budget 65536 --rows fsdp2-dyn-nrs-liger >> "$P/sync05.txt" 2>&1
      PYTHONPATH=/tmp/site:$pp timeout -k 10 150 python3 "$TT" --model qwen2.5-1.5b --tokenizer "$REPO/.tok" \
        --head chunked --iters 3 --rows fsdp2-dyn-nrs-liger >> "$P/sync15.txt" 2>&1
    done
  done
}
step_pg() {  # use_prefix_grouper off / on, rlforge only, 0.5B and 1.5B, issue 15's workload and best settings
  for m in ${PG_MODELS:-qwen2.5-0.5b qwen2.5-1.5b}; do for g in false true; do
    timeout -k 10 300 python3 benchmarks/e2e_grpo.py --tokenizer "$REPO/.tok" --models "$m" --skip-trl \
      --steps 5 --warmup 1 --reps 1 --token-budget 32768 --out "$P/pg_${m}_$g" --rlforge-extra \
      actor_rollout_ref.model.use_liger=true actor_rollout_ref.model.enable_gradient_checkpointing=false \
      actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false actor_rollout_ref.actor.use_prefix_grouper=$g \
      > "$P/pg_${m}_$g.txt" 2>&1
  done; done
}
step_mem() {  # allocated memory between steps: 0.5B rlforge only, 10 measured steps, small workload
  timeout -k 5 300 python3 -m pytest -n 0 -p no:cacheprovider tests/rollout/test_native_cuda.py \
    tests/rollout/test_split_kv_cuda.py tests/engine/test_engine_cuda.py \
    > "$P/mem_tests.txt" 2>&1
  timeout -k 10 300 python3 benchmarks/e2e_grpo.py --tokenizer "$REPO/.tok" --models qwen2.5-0.5b --skip-trl \
    --prompts 16 --n 8 --response-len 256 --steps 10 --warmup 1 --reps 1 --out "$P/mem" > "$P/mem.txt" 2>&1
  python3 benchmarks/memory_by_step.py "$P/mem/rep1/rlforge_qwen2.5-0.5b/metrics.jsonl" >> "$P/mem.txt" 2>&1
}
step_e2e() {
  timeout -k 10 1500 python3 benchmarks/e2e_grpo.py --tokenizer "$REPO/.tok" --models ${E2E_MODELS:-qwen2.5-0.5b qwen2.5-1.5b} \
    --steps 5 --warmup 1 --out "$P/e2e" ${E2E_ARGS:-} > "$P/e2e.txt" 2>&1
}

plan() {
  setup
  mark() { date -u +"$1 %T" >> "$P/progress.txt"; }
  mark start
  for s in $1; do
    (cd "$REPO" && "step_$s"); mark "$s rc=$?"
  done
  mark done
}

collect() {
  local wait_s=${1:-570} t=0
  while [ $t -lt "$wait_s" ] && ! grep -q "^done" "$P/progress.txt" 2>/dev/null; do sleep 10; t=$((t + 10)); done
  cat "$P/progress.txt"
  for f in "$P"/*.txt; do echo "=== $f"; tail -n 40 "$f"; done
  (cd "$P" && tar czf "$OUT/eplan.tgz" --exclude='*.pt' --exclude='*trace*' --exclude='*.safetensors' . 2>/dev/null)
}

case "$cmd" in
  start) rm -rf "$P"; mkdir -p "$P"; setsid bash -c "$(declare -f setup plan step_tests step_train step_offload \
           step_offprof step_e7b step_tune05 step_liger step_prof05l step_e2e step_head step_tph step_mtkv step_lora05 step_e2eprof step_pg step_lora7b step_rm step_sync step_mem); REPO='$REPO' P='$P' TT='$TT' E2E_MODELS='${E2E_MODELS:-}' E2E_ARGS='${E2E_ARGS:-}' PG_MODELS='${PG_MODELS:-}' LORA_ARGS='${LORA_ARGS:-}'; plan '$2'" > "$P/plan.log" 2>&1 < /dev/null &
         sleep 2; collect "${3:-570}" ;;
  wait) collect "${2:-570}" ;;
esac

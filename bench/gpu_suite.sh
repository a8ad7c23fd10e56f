#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md on one GPU, JSON per run under ${OUT:-bench_out}; ours and TRL
# run back to back. Usage: bench/gpu_suite.sh table|trl|ours|big [limit_s per run]
set -u
OUT=${OUT:-bench_out}; mkdir -p "$OUT"; LIMIT=${2:-240}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
ours() { timeout "$LIMIT" python3 bench/ppo_bench.py --device cuda --precision bf16 "$@"; }
trl() { timeout "$LIMIT" python3 bench/trl_side_by_side.py --device cuda "$@"; }
run() { local name=$1; shift; "$@" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items() if k in ('seconds_per_iteration','rollout_s','update_s','rollout_fraction','update_mfu','update_tflops','matmul_peak_tflops','peak_gpu_memory_gb')})" "$OUT/$name.json" "$name" 2>/dev/null || { echo "$name: no result"; grep -E "Error|error:" "$OUT/$name.log" | tail -2; }; }
S12="--n-layer 12 --n-embd 768 --batch 64 --max-new-tokens 128 --num-minibatches 4"
S24="--n-layer 24 --n-embd 1024 --batch 64 --max-new-tokens 128 --num-minibatches 4"
S4="--n-layer 4 --n-embd 256 --batch 32 --max-new-tokens 48 --num-minibatches 2"
B14="--n-layer 24 --n-embd 2048 --batch 64 --max-new-tokens 128 --num-minibatches 4"
case "$1" in
table)  # the table, ours and TRL alternated back to back
  run ours12 ours $S12 --static-cache --warmup 2 --iterations 3
  run trl12 trl $S12 --iterations 3
  run ours24 ours $S24 --static-cache --warmup 2 --iterations 3
  run trl24 trl $S24 --iterations 3
  run ours4 ours $S4 --static-cache --warmup 2 --iterations 3
  run trl4 trl $S4 --iterations 3 ;;
trl)
  run trl12 trl $S12 --iterations 3; run trl24 trl $S24 --iterations 3
  run trl4 trl $S4 --iterations 3 ;;
ours)
  run ours12 ours $S12 --static-cache --warmup 2 --iterations 4
  run ours24 ours $S24 --static-cache --warmup 2 --iterations 4
  run ours4 ours $S4 --static-cache --warmup 2 --iterations 4
  run ours12c ours $S12 --static-cache --compile --warmup 3 --iterations 3 ;;
big)
  run ours14_gc ours $B14 --static-cache --gradient-checkpointing --micro-batch-size 8 \
    --iterations 2
  run ours14_lora ours $B14 --static-cache --lora-r 16 --iterations 2 ;;
esac

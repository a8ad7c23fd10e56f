#!/usr/bin/env bash
# The issue-11 measurements on one GPU, runs alternated (ours, TRL, ours, ...), JSON per run
# under ${OUT:-bench_out}. Usage: bench/gpu_suite.sh shapes|big [limit_s per run]
set -u
OUT=${OUT:-bench_out}; mkdir -p "$OUT"; LIMIT=${2:-240}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
ours() { timeout "$LIMIT" python3 bench/ppo_bench.py --device cuda --precision bf16 "$@"; }
trl() { timeout "$LIMIT" python3 bench/trl_side_by_side.py --device cuda "$@"; }
show() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1].split('/')[-1], {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items() if k in ('seconds_per_iteration','rollout_s','update_s','rollout_fraction','update_mfu','update_tflops','matmul_peak_tflops','peak_gpu_memory_gb')})" "$1" 2>/dev/null || echo "$1: no result"; }
S12="--n-layer 12 --n-embd 768 --batch 64 --max-new-tokens 128 --num-minibatches 4"
S24="--n-layer 24 --n-embd 1024 --batch 64 --max-new-tokens 128 --num-minibatches 4"
S4="--n-layer 4 --n-embd 256 --batch 32 --max-new-tokens 48 --num-minibatches 2"
FAST="--static-cache --compile --warmup 2 --iterations 4"
case "$1" in
shapes)
  ours $S12 $FAST --json "$OUT/ours12.json" > "$OUT/ours12.log" 2>&1; show "$OUT/ours12.json"
  trl $S12 --iterations 3 --json "$OUT/trl12.json" > "$OUT/trl12.log" 2>&1; show "$OUT/trl12.json"
  ours $S24 $FAST --json "$OUT/ours24.json" > "$OUT/ours24.log" 2>&1; show "$OUT/ours24.json"
  trl $S24 --iterations 3 --json "$OUT/trl24.json" > "$OUT/trl24.log" 2>&1; show "$OUT/trl24.json"
  ;;
big)
  ours $S4 $FAST --json "$OUT/ours4.json" > "$OUT/ours4.log" 2>&1; show "$OUT/ours4.json"
  trl $S4 --iterations 3 --json "$OUT/trl4.json" > "$OUT/trl4.log" 2>&1; show "$OUT/trl4.json"
  B14="--n-layer 24 --n-embd 2048 --batch 64 --max-new-tokens 128 --num-minibatches 4"
  ours $B14 --static-cache --gradient-checkpointing --micro-batch-size 8 --iterations 2 \
    --json "$OUT/ours14_full_gc.json" > "$OUT/ours14_full_gc.log" 2>&1; show "$OUT/ours14_full_gc.json"
  ours $B14 --static-cache --lora-r 16 --iterations 2 \
    --json "$OUT/ours14_lora.json" > "$OUT/ours14_lora.log" 2>&1; show "$OUT/ours14_lora.json"
  ;;
esac

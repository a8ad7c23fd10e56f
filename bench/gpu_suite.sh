#!/usr/bin/env bash
# The GPU measurements of docs/benchmarks.md on one GPU, JSON per run under ${OUT:-bench_out};
# ours and TRL run back to back in one call.
# Usage: bench/gpu_suite.sh tests|table|table87|table305|pipeline|big|all [limit_s per run]
#   tests     the CUDA tests (pytest), the mixed-precision ratio's figures shown
#   table87   87M (12 x 768): ours eager, ours with ppo.compile, TRL 1.12 bf16; one more update
#             profiled (at 305M the profiled update did not end within a 130 s run)
#   table305  305M (24 x 1024): the same, no profile
#   pipeline  rlhf run on a Qwen2-shaped ~0.5B random init, chat data, bf16 (bench/gpu_pipeline.py)
#   all       tests, table87, pipeline, table305 (one call: about 9 minutes on an H100)
# A machine without the project's dependencies (prefect, mlflow, datasets, great-expectations,
# trl...) gets them from wheels in .whl/ when that folder exists (see docs/benchmarks.md).
set -u
OUT=${OUT:-bench_out}; mkdir -p "$OUT"; LIMIT=${2:-240}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1
if [ -d .whl ] && ! python3 -c "import prefect" 2>/dev/null; then
  [ -d /tmp/site/prefect ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
ours() { timeout "$LIMIT" python3 bench/ppo_bench.py --device cuda --precision bf16 "$@"; }
trl() { timeout "$LIMIT" python3 bench/trl_side_by_side.py --device cuda --precision bf16 "$@"; }
KEYS="seconds_per_iteration rollout_s update_s rollout_fraction update_mfu update_tflops
matmul_peak_tflops peak_gpu_memory_gb warmup_iterations_s profile_update_wall_s
profile_gpu_busy_s profile_kernel_launches"
run() {
  local name=$1; shift; local t0=$SECONDS
  "$@" --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1
  python3 - "$OUT/$name.json" "$name" "$KEYS" "$((SECONDS - t0))" <<'EOF' \
    || { echo "$name: no result"; grep -E "Error|error:" "$OUT/$name.log" | tail -3; }
import json, sys
d = json.load(open(sys.argv[1]))
r = lambda v: round(v, 3) if isinstance(v, float) else [r(x) for x in v] if isinstance(v, list) else v
print(sys.argv[2], f"({sys.argv[4]} s)", {k: r(v) for k, v in d.items() if k in sys.argv[3].split()})
for row in d.get("profile_top_kernels", [])[:6]:
    print("   ", row)
EOF
}
S12="--n-layer 12 --n-embd 768 --batch 64 --max-new-tokens 128 --num-minibatches 4"
S24="--n-layer 24 --n-embd 1024 --batch 64 --max-new-tokens 128 --num-minibatches 4"
S4="--n-layer 4 --n-embd 256 --batch 32 --max-new-tokens 48 --num-minibatches 2"
B14="--n-layer 24 --n-embd 2048 --batch 64 --max-new-tokens 128 --num-minibatches 4"
tests() {
  timeout "$LIMIT" python3 -m pytest -q -p no:cacheprovider -rP -o addopts="" \
    tests/rlhf_core/test_gpu.py tests/rlhf_core/test_hardware.py \
    tests/rlhf_core/test_serving.py::test_served_models_run_on_the_gpu_like_on_the_cpu \
    "tests/flows/test_chat_pipeline.py" -k "cuda or bf16 or hardware or gpu" \
    2>&1 | tee "$OUT/tests.log" | grep -E "passed|failed|FAILED|ERROR|first minibatch|^E " \
    | tail -25
}
table() {  # $1: shape label, $2: shape flags, $3: more flags for ours (eager)
  run "ours$1" ours $2 --static-cache --warmup 2 --iterations 3 ${3:-}
  run "ours$1c" ours $2 --static-cache --compile --warmup 2 --iterations 3
  run "trl$1" trl $2 --iterations 3
}
case "$1" in
tests) tests ;;
table87) table 12 "$S12" --profile ;;
table305) table 24 "$S24" ;;
table) table 12 "$S12"; table 24 "$S24"; table 4 "$S4" ;;
pipeline)
  timeout "$LIMIT" python3 bench/gpu_pipeline.py --out /tmp/gpu_pipeline \
    --json "$OUT/pipeline.json" > "$OUT/pipeline.log" 2>&1
  echo "pipeline exit $?"; grep -A12 "^stage  " "$OUT/pipeline.log" | tail -14
  grep -E "Error|error:" "$OUT/pipeline.log" | tail -3 ;;
all)
  echo "== tests"; LIMIT=150 tests
  echo "== 87M"; table 12 "$S12" --profile
  echo "== pipeline"; "$0" pipeline 170
  echo "== 305M"; table 24 "$S24" ;;
big)
  run ours14_gc ours $B14 --static-cache --gradient-checkpointing --micro-batch-size 8 \
    --iterations 2
  run ours14_lora ours $B14 --static-cache --lora-r 16 --iterations 2 ;;
esac

#!/usr/bin/env bash
# The CPU row of docs/benchmarks.md, re-checkable: TRL 1.12 and ours (fp32, and bf16
# autocast) on 2 threads, 4 x 256, 32 prompts x 48 tokens, 2 minibatches x 4 epochs,
# alternated for N rounds; prints each round's seconds per iteration, the medians and
# TRL / ours. On a shared small machine one round's ratio is noisy: use 5 rounds or more,
# with nothing else running.
# Usage: bench/cpu_row.sh [rounds (default 5)]   (needs the `bench` extra: trl==1.12.0)
set -eu
ROUNDS=${1:-5}; OUT=${OUT:-bench_out/cpu_row}; mkdir -p "$OUT"
PY=${PYTHON:-python3}
export OMP_WAIT_POLICY=ACTIVE TOKENIZERS_PARALLELISM=false
for r in $(seq 1 "$ROUNDS"); do
    $PY bench/trl_side_by_side.py --threads 2 --iterations 4 --json "$OUT/trl_$r.json" > "$OUT/trl_$r.log" 2>&1
    $PY bench/ppo_bench.py --threads 2 --iterations 4 --precision fp32 --json "$OUT/fp32_$r.json" > "$OUT/fp32_$r.log" 2>&1
    $PY bench/ppo_bench.py --threads 2 --iterations 4 --precision bf16 --json "$OUT/bf16_$r.json" > "$OUT/bf16_$r.log" 2>&1
    echo "round $r done"
done
$PY - "$OUT" "$ROUNDS" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {name: [json.load(open(f"{out}/{name}_{r}.json"))["seconds_per_iteration"]
               for r in range(1, rounds + 1)] for name in ("trl", "fp32", "bf16")}
trl = statistics.median(runs["trl"])
for name, values in runs.items():
    med = statistics.median(values)
    per_round = ", ".join(f"{t / v:.2f}" for t, v in zip(runs["trl"], values))
    print(f"{name:5s} s/iteration {', '.join(f'{v:.2f}' for v in values)}  median {med:.2f}"
          f"  TRL/this {trl / med:.2f}x (per round {per_round})")
PY

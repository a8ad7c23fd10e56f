"""The real-model example (configs/smollm2.yaml) in fp32 and in bf16 autocast, alternated per
seed on one machine: each stage's wall time in both and their ratio, the matmul peak this CPU
reaches in each precision (the bound a compute-bound stage approaches), and the learning
outcome side by side (the gold judge's win rate and paired interval against the SFT policy,
the reward model's gold accuracy, the alignment tax's probe).

    python bench/precision.py --out DIR --seeds 0,1,2
    python bench/precision.py --out DIR --seeds 0 --set ppo.iterations=4

Each run is bench/real_model.py's (a fresh folder, `rlhf run` as a user runs it); writes
DIR/fp32-seed<N>.json and DIR/bf16-seed<N>.json and DIR/precision.json (the table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_model import CONFIG, run_seed  # noqa: E402 - the sibling bench

PRECISIONS = ("fp32", "bf16")
OUTCOME = ("eval/judge_win_rate", "eval/vs_start_diff", "eval/vs_start_diff_low",
           "eval/vs_start_diff_high", "eval/rm_gold_accuracy", "eval/tax/probe_acc_base",
           "eval/tax/probe_acc_policy")


def matmul_gflops(threads: int, m: int = 1024, k: int = 2048, n: int = 2048,
                  repeats: int = 10) -> dict[str, float]:
    """GFLOP/s of an [m, k] x [k, n] matmul on ``threads`` threads, per precision (the best
    of ``repeats`` after a warm-up)."""
    import torch

    torch.set_num_threads(threads)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
        a @ b
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - start)
        out[name] = 2 * m * k * n / best / 1e9
    return out


def table(records: dict[str, list[dict]], peak: dict[str, float]) -> str:
    """Median stage walls per precision and their ratio, then each seed's outcome."""
    stages = [s for s in records["fp32"][0]["stage_wall_s"] if s]
    lines = [f"matmul peak: fp32 {peak['fp32']:.0f} GFLOP/s, bf16 {peak['bf16']:.0f} GFLOP/s "
             f"({peak['bf16'] / peak['fp32']:.2f}x)",
             f"{'stage':<14}{'fp32 s':>9}{'bf16 s':>9}{'ratio':>8}"]
    for stage in [*stages, "command"]:
        walls = {p: statistics.median(
            r["wall_s"] if stage == "command" else (r["stage_wall_s"].get(stage) or 0.0)
            for r in records[p]) for p in PRECISIONS}
        ratio = walls["fp32"] / walls["bf16"] if walls["bf16"] else float("nan")
        lines.append(f"{stage:<14}{walls['fp32']:>9.1f}{walls['bf16']:>9.1f}{ratio:>7.2f}x")
    for p in PRECISIONS:
        for r in records[p]:
            e = r["eval"]
            lines.append(
                f"{p} seed {r['seed']}: win {e['eval/judge_win_rate']:.3f}, diff "
                f"{e['eval/vs_start_diff']:+.3f} [{e['eval/vs_start_diff_low']:+.3f}, "
                f"{e['eval/vs_start_diff_high']:+.3f}], RM gold acc "
                f"{e['eval/rm_gold_accuracy']:.3f}, probe base {e['eval/tax/probe_acc_base']:.3f}"
                f" policy {e['eval/tax/probe_acc_policy']:.3f}; {r['decision']}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", default="0")
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--threads", type=int, default=2, help="for the matmul peak")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    peak = matmul_gflops(args.threads)
    records: dict[str, list[dict]] = {q: [] for q in PRECISIONS}
    for seed in (int(s) for s in args.seeds.split(",")):
        for precision in PRECISIONS:  # alternated: drift on the machine hits both alike
            records[precision].append(run_seed(
                args.out, precision, seed, [*args.set, f"model.precision={precision}"],
                args.config.resolve()))
            print(f"{precision} seed {seed}: {records[precision][-1]['wall_s']:.0f} s",
                  flush=True)
    text = table(records, peak)
    (args.out / "precision.json").write_text(json.dumps(
        {"peak_gflops": peak, "runs": records, "table": text}, indent=1))
    print(text)


if __name__ == "__main__":
    main()

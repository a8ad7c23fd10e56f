"""The real-model example (configs/smollm2.yaml: SmolLM2-135M-Instruct, LoRA in every stage) as a
user runs it, one `rlhf run` per seed in a fresh folder: the command's wall and peak memory,
each stage's wall, the gold judge's verdict against the SFT policy (paired interval), the
health findings, the register decision and the disk the run left.

    python bench/real_model.py --out DIR --seeds 0,1,2,3,4
    python bench/real_model.py --out DIR --seeds 0 --name full --set model.lora=null
    python bench/real_model.py --out DIR --seeds 0 --name toy --config configs/smollm2-toy.yaml

Each run's folder links the checkout's configs/, so a config's relative data paths resolve.

Writes DIR/<name>-seed<N>.json per run and prints a table row each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "smollm2.yaml"


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def run_seed(out: Path, name: str, seed: int, sets: list[str], config: Path = CONFIG) -> dict:
    folder = out / f"{name}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "configs").exists():
        (folder / "configs").symlink_to(ROOT / "configs")
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "cli", "run", "--config", str(config),
           "--set", f"seed={seed}", "--set", "tracking.progress=false"]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlflow.db",
           "PREFECT_HOME": str(folder / "prefect"), "PYTHONPATH": str(ROOT)}
    env.pop("PREFECT_API_URL", None)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (folder / "stdout.log").write_text(proc.stdout)
    (folder / "stderr.log").write_text(proc.stderr)
    parent = re.search(r"MLflow parent run: (\w+)", proc.stdout)
    if proc.returncode != 0 or parent is None:
        raise SystemExit(f"{name} seed {seed}: rlhf run failed; see {folder}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    record = {"name": name, "seed": seed, "sets": sets, "wall_s": round(wall, 1),
              "peak_rss_gb": int(rss.group(1)) / 2**20 if rss else None,
              **read_run(f"sqlite:///{folder}/mlflow.db", parent.group(1)),
              "disk_workdir_bytes": du(folder / "rlhf_runs"),
              "disk_mlruns_bytes": du(folder / "mlruns")}
    (out / f"{name}-seed{seed}.json").write_text(json.dumps(record, indent=1))
    return record


def read_run(uri: str, parent_id: str) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    parent = client.get_run(parent_id)
    children = client.search_runs([parent.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent_id}'")
    stages = {r.data.tags.get("rlhf.stage"): r for r in children}
    walls = {s: r.data.metrics.get("time/stage_s") for s, r in stages.items()}
    register = stages.get("register")
    ppo = stages.get("ppo")
    keys = ("eval/judge_win_rate", "eval/judge_score_sft", "eval/judge_score_policy",
            "eval/kl_to_ref", "eval/vs_start_diff", "eval/vs_start_diff_low",
            "eval/vs_start_diff_high", "eval/rm_gold_accuracy", "eval/tax/probe_acc_base",
            "eval/tax/probe_acc_sft", "eval/tax/probe_acc_policy",
            "eval/tax/probe_diff_policy_base", "eval/tax/probe_diff_policy_base_low",
            "eval/tax/probe_diff_policy_base_high", "eval/tax/bpb_base", "eval/tax/bpb_sft",
            "eval/tax/bpb_policy")
    return {"stage_wall_s": walls,
            "eval": {k: parent.data.metrics.get(k) for k in keys},
            "health_flags": ppo.data.tags.get("rlhf.health.flags") if ppo else None,
            "decision": register.data.tags.get("rlhf.register.decision") if register else None,
            "reason": register.data.tags.get("rlhf.register.reason") if register else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeds", default="0")
    p.add_argument("--name", default="lora")
    p.add_argument("--config", type=Path, default=CONFIG)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in (int(s) for s in args.seeds.split(",")):
        r = run_seed(args.out, args.name, seed, args.set, args.config.resolve())
        e = r["eval"]
        print(f"{r['name']} seed {seed}: {r['wall_s']:.0f} s, {r['peak_rss_gb']:.2f} GB; win "
              f"{e['eval/judge_win_rate']:.3f}, gold {e['eval/judge_score_sft']:.2f} -> "
              f"{e['eval/judge_score_policy']:.2f} (diff CI [{e['eval/vs_start_diff_low']:+.3f},"
              f" {e['eval/vs_start_diff_high']:+.3f}]), KL {e['eval/kl_to_ref']:.2f}; probe "
              f"base {e['eval/tax/probe_acc_base']} sft {e['eval/tax/probe_acc_sft']} policy "
              f"{e['eval/tax/probe_acc_policy']}; bpb {e['eval/tax/bpb_base']} "
              f"{e['eval/tax/bpb_sft']} {e['eval/tax/bpb_policy']}; flags "
              f"{r['health_flags'] or 'none'}; {r['decision']}; stages {r['stage_wall_s']}",
              flush=True)


if __name__ == "__main__":
    main()

"""Speed of a retrain round (docs/retraining.md): a first champion, then N alternated rounds of
collect (`rlhf demo-batch`: sample the champion, label with the demo's gold judge, import) and
retrain (`rlhf retrain`: RM, PPO, gate, register), each a fresh `rlhf` process as a user runs
it. Reports each command's wall, the medians over the rounds, and where a retrain's time goes
(each stage's ``time/stage_s`` from MLflow; the rest is process start, imports, Prefect's
ephemeral API and MLflow bookkeeping).

    python bench/retrain_round.py --runs 3 --set seed=11          # the demo, default settings
    python bench/retrain_round.py --runs 2 --config configs/test.yaml
    python bench/retrain_round.py --runs 3 --control --degraded --compare --set seed=11

``--control``: before each round, a control round (`rlhf retrain --control`: the same retrain
on the earlier data alone, gated, nothing registered), so the table shows what the new labels
added; ``--degraded``: then a batch labelled the way the judge would not (quarantined?);
``--compare``: at the end, the champion against the first one by the gate (`rlhf compare 1`).
A ``--workdir`` that already holds a champion skips the bootstrap, and a round-1 batch already
waiting in its watch folder skips the first collection.

Writes bench/results/retrain_round-<time>.json (``--out`` to change).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rlhf(args: list[str], sets: list[str], prefect_home: Path) -> tuple[float, str]:
    """Run `rlhf ARGS --set ...` -> (wall seconds, stdout). Its own PREFECT_HOME: a retrain
    elsewhere on the machine holding the one-slot retrain limit in the shared local Prefect
    database would make this one skip."""
    cmd = [sys.executable, "-m", "cli", *args]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "PREFECT_HOME": str(prefect_home)}
    env.pop("PREFECT_API_URL", None)
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    return wall, out.stdout


def stage_times(uri: str, experiment: str, parent_run_id: str) -> dict[str, float]:
    """The retrain's stages -> seconds (``time/stage_s`` of each child run)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id],
                              filter_string=f"tags.`mlflow.parentRunId` = '{parent_run_id}'")
    return {r.data.tags.get("rlhf.stage", r.info.run_name): r.data.metrics["time/stage_s"]
            for r in runs if "time/stage_s" in r.data.metrics}


def parse(stdout: str) -> dict:
    found = {}
    if m := re.search(r"retrain: (\S+) \(([\d.]+) s\)", stdout):
        found.update(status=m.group(1), flow_s=float(m.group(2)))
    if m := re.search(r"MLflow parent run: (\w+)", stdout):
        found["parent_run_id"] = m.group(1)
    if m := re.search(r"gate: (.*)", stdout):
        found["gate"] = m.group(1)
    if "quarantined" in stdout.lower():
        found["quarantined"] = True
    return found


def gate_tags(uri: str, parent_run_id: str) -> dict:
    """The gate's decision, mean difference and CI from the run's tags, and the health
    watch's flags."""
    from mlflow.tracking import MlflowClient

    tags = MlflowClient(uri).get_run(parent_run_id).data.tags
    out = {k: tags[f"rlhf.gate.{k}"] for k in ("decision", "diff_mean", "ci_low", "ci_high",
                                               "kl_champion", "kl_challenger")
           if f"rlhf.gate.{k}" in tags}
    if "rlhf.health.flags" in tags:  # what PPO's health watch found in the round
        out["health_flags"] = tags["rlhf.health.flags"]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="collect + retrain rounds")
    p.add_argument("--config", help="pipeline config (default: the demo)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--workdir", help="store, watch folder, work (default: a temp folder)")
    p.add_argument("--out", type=Path)
    p.add_argument("--control", action="store_true", help="a control round before each round")
    p.add_argument("--degraded", action="store_true", help="a degraded batch after the rounds")
    p.add_argument("--compare", action="store_true", help="the champion against v1 at the end")
    args = p.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="retrain-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    uri = f"sqlite:///{work}/mlflow.db"
    sets = [f"tracking.tracking_uri={uri}", f"tracking.workdir={work}/work",
            f"retrain.watch_dir={work}/watch", f"collect.out_dir={work}/to_label",
            "tracking.system_metrics=false", *args.set]
    config = ["--config", args.config] if args.config else []
    from tasks.config.pipeline_config import load_config

    cfg = load_config(Path(args.config) if args.config else ROOT / "configs" / "demo.yaml",
                      sets)
    rows = []

    def record(kind: str, i: int, wall: float, stdout: str) -> dict:
        row = {"kind": kind, "round": i, "wall_s": round(wall, 1), **parse(stdout)}
        if kind != "collect" and "parent_run_id" in row:
            row["stages"] = stage_times(uri, cfg.tracking.experiment, row["parent_run_id"])
            row.update(gate_tags(uri, row["parent_run_id"]))
        rows.append(row)
        print(json.dumps(row), flush=True)
        return row

    home = work / "prefect"
    if not (work / "mlflow.db").exists():
        record("bootstrap", 0, *rlhf(["retrain", *config], sets, home))
    waiting = any((work / "watch").glob("*.jsonl"))  # a first batch ready: no first collect
    for i in range(1, args.runs + 1):  # alternated: collect, retrain, collect, retrain...
        if args.control:
            record("control", i, *rlhf(["retrain", "--control", *config], sets, home))
        if not (i == 1 and waiting):
            record("collect", i, *rlhf(["demo-batch", "--seed", str(i), *config], sets, home))
        record("retrain", i, *rlhf(["retrain", *config], sets, home))
    if args.degraded:  # the rounds may have used up the demo's pool: the same prompts anew
        from rlhf_core.demo import training_prompts

        pool = work / "degraded_prompts.jsonl"
        pool.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in training_prompts()))
        record("degraded", 0, *rlhf(["demo-batch", "--degraded", "--seed", "99", *config],
                                    [*sets, f"collect.prompts={pool}"], home))
    if args.compare:
        record("compare", 0, *rlhf(["compare", "1", *config], sets, home))
    summary = summarise(rows)
    print(json.dumps(summary, indent=2))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "bench" / "results" / f"retrain_round-{stamp}.json"
    out.write_text(json.dumps({"sets": sets, "rows": rows, "summary": summary}, indent=2))
    print(f"wrote {out}")


def summarise(rows: list[dict]) -> dict:
    """Medians of each command's wall over the rounds, and of each retrain stage."""
    def med(kind, key="wall_s"):
        values = [r[key] for r in rows if r["kind"] == kind and key in r]
        return round(statistics.median(values), 1) if values else None

    stages: dict[str, list[float]] = {}
    for r in rows:
        if r["kind"] == "retrain":
            for k, v in r.get("stages", {}).items():
                stages.setdefault(k, []).append(v)
    collect, retrain = med("collect"), med("retrain")
    return {"bootstrap_s": med("bootstrap"), "collect_median_s": collect,
            "retrain_median_s": retrain, "retrain_flow_median_s": med("retrain", "flow_s"),
            "round_median_s": round(collect + retrain, 1) if collect and retrain else None,
            "retrain_stage_median_s": {k: round(statistics.median(v), 1)
                                       for k, v in sorted(stages.items())},
            "decisions": [r.get("status") for r in rows if r["kind"] == "retrain"]}


if __name__ == "__main__":
    main()

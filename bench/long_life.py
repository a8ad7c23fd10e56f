"""A loop that runs for months (docs/benchmarks.md): what deciding costs as retrain rounds pile
up. Writes the records a retrain round leaves in an MLflow store, without training: a parent run
(the resolved config as ~150 params, its tags, the consumed batch's digest), eight stage child
runs with their metrics, a registered policy version with its tags and the champion alias
moved, and the batch file in the watched folder. Then times, as a user runs them, `rlhf retrain`
with nothing new (its own "decided in" figure and the whole command), `rlhf runs` and
`rlhf compare 1 2`, on the store with one round and after ``--rounds`` rounds.

`rlhf compare` needs two versions with real checkpoints: before the simulated rounds one tiny
pipeline run (configs/test.yaml) registers v1 of the policy, and v1's run and lineage are
registered again as v2 (the same models: the figure is the command's cost, not a verdict).

    python bench/long_life.py --rounds 200 --out /tmp/long_life [--json result.json]
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
sys.path.insert(0, str(ROOT))

from tasks.config.pipeline_config import flatten, load_config  # noqa: E402
from tasks.platform.mlflow.tags import CONSUMED_TAG, STAGE_TAG  # noqa: E402

STAGES = ("validate", "sft", "reward_model", "reward_norm", "critic_init", "ppo", "evaluate",
          "register")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3, help="timed commands per point")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-compare", action="store_true",
                    help="skip `rlhf compare` (and the real pipeline run it needs)")
    return ap.parse_args(argv)


def settings(out: Path) -> list[str]:
    return [f"tracking.tracking_uri=sqlite:///{out}/mlflow.db", "tracking.experiment=long-life",
            f"tracking.workdir={out}/runs", f"retrain.watch_dir={out}/batches",
            "tracking.system_metrics=false"]


def write_round(client, exp_id: str, i: int, params: dict, out: Path) -> None:
    """One round's records: parent + stage runs, a batch file it consumed, a policy version
    registered from it (champion moved every other round)."""
    batch = out / "batches" / f"batch-{i:04d}.jsonl"
    batch.write_text(json.dumps({"prompt": f"p{i}", "chosen": "a", "rejected": "b"}) + "\n")
    import hashlib

    digest = hashlib.sha256(batch.read_bytes()).hexdigest()[:16]
    parent = client.create_run(exp_id, run_name=f"round-{i:04d}", tags={
        "rlhf.config_hash": f"{i:012x}", CONSUMED_TAG: json.dumps([digest])})
    pid = parent.info.run_id
    from mlflow.entities import Metric, Param

    client.log_batch(pid, params=[Param(k, str(v)[:250]) for k, v in params.items()])
    client.log_batch(pid, metrics=[Metric(f"eval/m{j}", float(i + j), 0, 0) for j in range(17)])
    for stage in STAGES:
        child = client.create_run(exp_id, run_name=stage, tags={
            "mlflow.parentRunId": pid, STAGE_TAG: stage})
        client.log_batch(child.info.run_id, metrics=[
            Metric(f"{stage}/m{j}", float(j), 0, step) for j in range(8) for step in range(4)])
        client.set_terminated(child.info.run_id)
    client.set_terminated(pid)
    version = client.create_model_version("rlhf-policy", f"runs:/{pid}/policy", run_id=pid,
                                          tags={"rlhf.ancestry": f"v{i + 1}"})
    if i % 2 == 0:
        client.set_registered_model_alias("rlhf-policy", "champion", version.version)


# `rlhf compare` scores with the demo's judge; the tiny config holds 16 held-out prompts
COMPARE_SETS = ("retrain.gate.scorer=judge", "retrain.gate.min_prompts=16")


def real_versions(out: Path, env: dict, client) -> None:
    """v1: registered by one tiny pipeline run; v2: v1's run and lineage registered again."""
    sets = [a for s in settings(out) for a in ("--set", s)]
    proc = subprocess.run([sys.executable, "-m", "cli", "run", "--config",
                           str(ROOT / "configs" / "test.yaml"), *sets], env=env, cwd=ROOT,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the pipeline run for `rlhf compare` failed:\n{proc.stderr[-2000:]}")
    import mlflow

    mlflow.set_tracking_uri(client.tracking_uri)  # the registry finds v1's logged model there
    v1 = client.get_model_version("rlhf-policy", "1")
    client.create_model_version("rlhf-policy", v1.source, run_id=v1.run_id, tags=v1.tags)


def timed(cmd: list[str], env: dict, repeats: int) -> tuple[float, float | None, str]:
    """Median wall time of ``cmd``, the median "(N.N s)" it printed (retrain's own decision
    time), its last output line."""
    walls, decided, last = [], [], ""
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT)
        walls.append(time.perf_counter() - start)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-2000:]}")
        found = re.search(r"retrain: nothing new \(([\d.]+) s\)", proc.stdout)
        if found:
            decided.append(float(found.group(1)))
        last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    med = sorted(walls)[len(walls) // 2]
    return med, (sorted(decided)[len(decided) // 2] if decided else None), last


def bench_env() -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PREFECT_LOGGING_LEVEL": "WARNING"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def measure(out: Path, repeats: int, compare: bool) -> dict:
    env = bench_env()
    sets = [a for s in settings(out) for a in ("--set", s)]
    config = ["--config", str(ROOT / "configs" / "test.yaml")]
    retrain_wall, decided, line = timed([sys.executable, "-m", "cli", "retrain", *config, *sets],
                                        env, repeats)
    runs_wall, _, _ = timed([sys.executable, "-m", "cli", "runs", "--experiment", "long-life",
                             "--limit", "20"],
                            {**env, "MLFLOW_TRACKING_URI": f"sqlite:///{out}/mlflow.db"},
                            repeats)
    result = {"retrain_wall_s": round(retrain_wall, 2), "retrain_decided_s": decided,
              "retrain_says": line, "runs_wall_s": round(runs_wall, 2)}
    if compare:
        cmp_sets = [a for s in COMPARE_SETS for a in ("--set", s)]
        compare_wall, _, _ = timed([sys.executable, "-m", "cli", "compare", *config, *sets,
                                    *cmp_sets, "1", "2"], env, repeats)
        result["compare_wall_s"] = round(compare_wall, 2)
    return {**result, "store_bytes": (out / "mlflow.db").stat().st_size}


def main(argv=None) -> dict:
    args = parse_args(argv)
    from mlflow import MlflowClient

    (args.out / "batches").mkdir(parents=True, exist_ok=True)
    cfg = load_config(ROOT / "configs" / "test.yaml", settings(args.out))
    params = flatten(cfg.model_dump(mode="json"))
    client = MlflowClient(cfg.tracking.tracking_uri)
    exp_id = client.get_experiment_by_name("long-life")
    exp_id = exp_id.experiment_id if exp_id else client.create_experiment("long-life")
    if not args.no_compare:
        real_versions(args.out, bench_env(), client)
    if not client.search_registered_models(filter_string="name = 'rlhf-policy'"):
        client.create_registered_model("rlhf-policy")
    write_round(client, exp_id, 0, params, args.out)
    compare = not args.no_compare
    result = {"rounds": args.rounds, "one_round": measure(args.out, args.repeats, compare)}
    print("1 round:", result["one_round"], flush=True)
    start = time.perf_counter()
    for i in range(1, args.rounds):
        write_round(client, exp_id, i, params, args.out)
    result["write_s"] = round(time.perf_counter() - start, 1)
    result["after"] = measure(args.out, args.repeats, compare)
    one, after = result["one_round"], result["after"]
    result["store_bytes_per_round"] = (after["store_bytes"] - one["store_bytes"]) // max(
        1, args.rounds - 1)
    print(f"{args.rounds} rounds:", after)
    print(f"retrain decided in {one['retrain_decided_s']} s -> {after['retrain_decided_s']} s; "
          f"command {one['retrain_wall_s']} -> {after['retrain_wall_s']} s; rlhf runs "
          f"{one['runs_wall_s']} -> {after['runs_wall_s']} s; rlhf compare "
          f"{one.get('compare_wall_s')} -> {after.get('compare_wall_s')} s; store "
          f"{result['store_bytes_per_round']} bytes per round")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()

"""PPO's health detectors against the demo's gold judge, on the 2-core CPU.

    python bench/health.py run --out DIR                  # every case: real `rlhf run`s
    python bench/health.py run --out DIR --cases seed-0,lr-x30 [--threads 1]
    python bench/health.py report --out DIR [--replay]     # the tables (and the picture)
    python bench/health.py retrain --out DIR --seeds 7,8   # bootstrap + first on-policy round

Healthy runs: the demo at its defaults for seeds 0-9, and a few sane variations (a higher and a
lower KL coefficient, the adaptive KL controller, a lower learning rate, RLOO, twice the
iterations). Induced failures, one per detector: ``kl_coef`` 0 with long training (reward
hacking), a reward model whose rater also liked longer replies (``demo.rm_length_bias``: a flaw
the judge's pairs do not have; reward hacking again), the learning rate x30 (a KL spike), a low
temperature with a high learning rate (entropy collapse), an unclipped value loss with rewards
x100 (critic divergence: a missing EOS scores -100 and the budget is short), a clip range of
1e-4 (the reward never moves), one prompt per generate call and one epoch of updates (generation
dominates). Each runs with every detector's action ``warn``, so the whole run is recorded;
``hacking-stop`` is the hacking run with the default actions and reward hacking's ``stop``.

Ground truth. Reward hacking: the gold judge (which never trains anything) at the held-out
checks; its onset is the first check after the gold score's peak where it is ``GOLD_MARGIN``
below that peak while the proxy score is above its value at the peak (the start is the peak of
a run whose gold score never rises ``GOLD_MARGIN`` above it). The other failures: their own
defining metric leaving the range every healthy run kept it in (KL above the healthy runs'
highest, entropy below their lowest, value loss above their highest after the critic's first
``WARMUP`` iterations, clip fraction above their highest, the rollout's share of time above
their highest). Detection: the iteration of the detector's finding. A false alarm: any finding
on a healthy run, except reward hacking found at or after a gold onset (a run at sane
settings that hacks by the gold judge is reported apart). The held-out checks' cost: their
time over the ppo stage's, at the defaults. How well each scorer can see a change: between two
consecutive checks, the share of the answers that changed (the gold score moved) whose score
moved the gold judge's way (0.5 is a coin).

``report --replay`` runs the detectors again on the recorded runs with the settings in the
code now (a calibration aid: the figures to publish are the online ones). Each case's record
is ``DIR/<case>.json``; the report is ``DIR/report.json`` and ``DIR/hacking.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WARN_ALL = [f"ppo.health.{d}.action=warn" for d in (
    "reward_hacking", "kl_spike", "entropy_collapse", "critic_divergence", "flat_reward",
    "slow_rollout")]
HEALTHY = {**{f"seed-{i}": [f"seed={i}"] for i in range(10)},
           "kl-0.1": ["ppo.kl_coef=0.1"], "kl-0.02": ["ppo.kl_coef=0.02"],
           "adaptive-kl": ["ppo.adaptive_kl=true"], "lr-half": ["ppo.optim.lr=2.5e-4"],
           "rloo": ["ppo.advantage_estimator=rloo", "ppo.samples_per_prompt=4"],
           "long": ["ppo.iterations=120", "ppo.eval_every=6"]}
FAILURES = {  # case -> (the detector it should set off, overrides)
    "hacking": ("reward_hacking", ["ppo.kl_coef=0", "ppo.iterations=240", "ppo.eval_every=6"]),
    "hacking-length": ("reward_hacking", ["demo.rm_length_bias=0.5", "ppo.iterations=120",
                                          "ppo.eval_every=6"]),
    "lr-x30": ("kl_spike", ["ppo.optim.lr=1.5e-2"]),
    "entropy": ("entropy_collapse", ["ppo.temperature=0.3", "ppo.optim.lr=5e-3"]),
    "critic": ("critic_divergence", ["ppo.clip_eps_value=1e6", "ppo.missing_eos_penalty=-100",
                                     "ppo.max_new_tokens=10"]),
    "flat": ("flat_reward", ["ppo.clip_eps=1e-4"]),
    "slow-rollout": ("slow_rollout", ["ppo.generation_batch_size=1", "ppo.ppo_epochs=1"]),
    "hacking-60": ("reward_hacking", ["ppo.kl_coef=0"]),
}
# A fast start whose KL spikes and falls back, each run ending above the default demo by the
# gold judge: a watch that stops them keeps a worse policy than the run would have ended with.
RECOVERING = {"fast-start": ["ppo.optim.lr=2.2e-3"], "lr-x6": ["ppo.optim.lr=3e-3"]}
STOPPED = {"hacking-stop": ["ppo.kl_coef=0", "ppo.iterations=240", "ppo.eval_every=6",
                            "ppo.health.reward_hacking.action=stop"]}
GOLD_MARGIN = 0.3  # gold points below its running peak: the hacking onset
WARMUP = 5  # iterations the critic has to fit before its value loss counts
DEFINING = {"kl_spike": ("objective/kl", max), "entropy_collapse": ("policy/entropy_avg", min),
            "critic_divergence": ("loss/value_avg", max),
            "flat_reward": ("policy/clipfrac_avg", max), "slow_rollout": ("rollout_share", max)}
SERIES = ("objective/kl", "objective/scores", "objective/raw_scores", "objective/entropy",
          "policy/entropy_avg", "policy/clipfrac_avg", "loss/value_avg",
          "val/explained_variance", "response/length_mean", "time/rollout_s", "time/update_s",
          "time/check_s", "judge/score", "check/proxy_score", "check/judge_score",
          "check/gold_score", "check/kl", "check/length_mean", "time/stage_s")


def run_case(name: str, overrides: list[str], out: Path) -> dict:
    """One `rlhf run` of the demo with ``overrides`` in ``out/<name>`` -> its record."""
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "cli", "run"]  # the tree this script lies in (PYTHONPATH)
    for item in [*overrides, "tracking.progress=false", "tracking.experiment=health-bench",
                 f"tracking.run_name=health-{name}", "tracking.system_metrics=false"]:
        cmd += ["--set", item]
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlflow.db", "PATH": "/usr/bin:/bin",
           "HOME": str(folder), "PREFECT_HOME": str(folder / "prefect"),
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT),
           # a busy machine (two runners side by side) can take minutes to start Prefect
           "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "900"}
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (folder / "stdout.log").write_text(proc.stdout + proc.stderr)
    found = re.search(r"MLflow parent run: (\w+)", proc.stdout)
    if proc.returncode != 0 or found is None:
        raise SystemExit(f"{name}: rlhf run failed ({proc.returncode}); see {folder}/stdout.log")
    record = read_run(f"sqlite:///{folder}/mlflow.db", found.group(1))
    record.update(name=name, overrides=overrides, wall_s=round(wall, 1))
    (out / f"{name}.json").write_text(json.dumps(record))
    return record


def read_run(uri: str, parent: str) -> dict:
    """The parent run's eval metrics and the ppo run's series, checks and findings."""
    import os

    from mlflow.tracking import MlflowClient

    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    client = MlflowClient(uri)
    run = client.get_run(parent)
    (ppo,) = client.search_runs([run.info.experiment_id],
                                f"tags.`mlflow.parentRunId` = '{parent}' and "
                                "tags.`rlhf.stage` = 'ppo'")
    pid = ppo.info.run_id
    series = {key: {m.step: m.value for m in client.get_metric_history(pid, key)}
              for key in SERIES}
    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        for item in client.list_artifacts(pid, "checks"):
            table = json.loads(Path(client.download_artifacts(pid, item.path, tmp)).read_text())
            rows = [dict(zip(table["columns"], row)) for row in table["data"]]
            checks.append({"iteration": rows[0]["iteration"],
                           "responses": [r["response"] for r in rows],
                           **{k: [r.get(f"{k}_score") for r in rows]
                              for k in ("proxy", "judge", "gold")},
                           "kl": [r["kl"] for r in rows], "length": [r["length"] for r in rows],
                           "drift": [r.get("rm_drift") for r in rows]})
    findings = _health_table(client, pid)
    register = client.search_runs([run.info.experiment_id],
                                  f"tags.`mlflow.parentRunId` = '{parent}' and "
                                  "tags.`rlhf.stage` = 'register'")
    decision = {k.removeprefix("rlhf.register."): v for k, v in
                (register[0].data.tags.items() if register else ())
                if k in ("rlhf.register.decision", "rlhf.register.reason")}
    return {"parent_run_id": parent, "eval": dict(run.data.metrics), "series": series,
            "checks": sorted(checks, key=lambda c: c["iteration"]), "findings": findings,
            "stopped": ppo.data.tags.get("rlhf.health.stopped"), "register": decision}


def _health_table(client, run_id: str) -> list[dict]:
    names = [a.path for a in client.list_artifacts(run_id)]
    if "health.json" not in names:
        return []
    with tempfile.TemporaryDirectory() as tmp:
        table = json.loads(Path(client.download_artifacts(run_id, "health.json", tmp))
                           .read_text())
    return [dict(zip(table["columns"], row)) for row in table["data"]]


# -- analysis ----------------------------------------------------------------------------------
def iterations(rec: dict) -> list[int]:
    return sorted(int(k) for k in rec["series"]["objective/kl"])


def value(rec: dict, key: str, it: int) -> float:
    if key == "rollout_share":
        roll, upd = (rec["series"][k].get(str(it), math.nan) for k in
                     ("time/rollout_s", "time/update_s"))
        check = rec["series"]["time/check_s"].get(str(it), 0.0)
        return roll / (roll + upd + check)
    return rec["series"][key].get(str(it), math.nan)


def healthy_envelope(healthy: list[dict]) -> dict[str, float]:
    """Each defining metric's extreme over every healthy run (after the first iterations)."""
    out = {}
    for detector, (key, pick) in DEFINING.items():
        skip = WARMUP if detector in ("critic_divergence", "flat_reward", "slow_rollout") else 0
        values = [value(r, key, it) for r in healthy for it in iterations(r)[skip:]]
        out[detector] = pick(v for v in values if not math.isnan(v))
    return out


def hacking_onset(rec: dict) -> tuple[int | None, dict]:
    """The first check after the gold score's peak (the best the run ever reaches) where it
    sits GOLD_MARGIN below that peak while the proxy is above its value there ->
    (iteration, the gold curve's figures). A dip the run recovers from is not the onset. A run
    whose gold score never rises GOLD_MARGIN above its start hacks from the start: its peak is
    the start."""
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    golds = [(c["iteration"], mean(c["gold"]), mean(c["proxy"])) for c in rec["checks"]]
    peak = max(golds, key=lambda g: g[1])
    if peak[1] < golds[0][1] + GOLD_MARGIN:
        peak = golds[0]
    onset = next((it for it, gold, proxy in golds if it > peak[0]
                  and gold < peak[1] - GOLD_MARGIN and proxy > peak[2]), None)
    return onset, {"gold_start": golds[0][1], "gold_peak": peak[1],
                   "gold_peak_iteration": peak[0],
                   "gold_half_lost": peak[1] - (peak[1] - golds[0][1]) / 2}


def defining_onset(rec: dict, detector: str, bound: float) -> int | None:
    key, pick = DEFINING[detector]
    for it in iterations(rec):
        v = value(rec, key, it)
        if detector in ("critic_divergence", "flat_reward", "slow_rollout") and it <= WARMUP:
            continue
        if (pick is max and v > bound) or (pick is min and v < bound) or \
                (detector == "critic_divergence" and not math.isfinite(v)):
            return it
    return None


HACKING = ("reward_hacking", "off_distribution", "length_shift")  # the detectors of hacking


def first(findings: list[dict], detector: str) -> dict | None:
    """The first finding of ``detector`` (for reward_hacking: of either hacking detector)."""
    names = HACKING if detector == "reward_hacking" else (detector,)
    return next((f for f in findings if f["detector"] in names), None)


def report(out: Path, replay: bool) -> dict:
    records = {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json"))
               if p.stem != "report" and not p.stem.startswith("retrain")}
    if replay:
        for rec in records.values():
            rec["findings"], rec["standing"] = replayed(rec)
    healthy = [records[n] for n in HEALTHY if n in records]
    bounds = healthy_envelope(healthy) if healthy else {}
    rows = []
    for name, (detector, _) in FAILURES.items():
        rec = records.get(name)
        if rec is None:
            continue
        found = first(rec["findings"], detector)
        if detector == "reward_hacking":
            onset, extra = hacking_onset(rec)
        else:
            onset, extra = defining_onset(rec, detector, bounds[detector]), {}
        row = {"case": name, "detector": detector, "onset": onset,
               "detected": found["iteration"] if found else None,
               "first_finding": (rec["findings"][0]["detector"], rec["findings"][0]["iteration"])
               if rec["findings"] else None, **extra}
        if found and onset is not None:
            row["latency"] = found["iteration"] - onset
        if detector == "reward_hacking" and found:
            row.update(gold_at(rec, found))
        rows.append(row)
    alarms, gold_hacking = {}, {}
    for n in (n for n in HEALTHY if n in records):  # a run at sane settings can still hack:
        onset, extra = hacking_onset(records[n])   # the gold judge says whether it did
        if onset is not None:
            found = first(records[n]["findings"], "reward_hacking")
            gold_hacking[n] = {"onset": onset, "detected": found and found["iteration"],
                               **extra, **(gold_at(records[n], found) if found else {})}
        alarms[n] = [(f["detector"], f["iteration"]) for f in records[n]["findings"]
                     if not (f["detector"] in HACKING and onset is not None
                             and f["iteration"] >= onset)]
    cost = [sum(r["series"]["time/check_s"].values()) / r["series"]["time/stage_s"]["0"]
            for r in healthy if r["series"]["time/stage_s"]]
    agreement = {n: {k: agreement_with_gold(r, k) for k in ("proxy", "judge")}
                 for n, r in records.items()}
    if "hacking" in records:
        plot_hacking(records["hacking"], out / "hacking.png")
    decisions = {n: {"decision": r.get("register", {}).get("decision"),
                     "standing_at_end": r.get("standing"),
                     "win_rate": r["eval"].get("eval/judge_win_rate"),
                     "gold": r["eval"].get("eval/judge_score_policy")}
                 for n, r in records.items()}
    result = {"bounds": bounds, "failures": rows, "false_alarms": alarms, "register": decisions,
              "gold_hacking_in_healthy_runs": gold_hacking,
              "check_share_of_ppo": cost, "stopped": stopped_figures(records),
              "agreement_with_gold": agreement}
    (out / "report.json").write_text(json.dumps(result, indent=1))
    return result


def agreement_with_gold(rec: dict, scorer: str) -> float | None:
    """Between consecutive checks, per prompt: of the answers whose gold score moved, the
    share whose ``scorer`` score moved the same way (None: no such answer)."""
    same = moved = 0
    for then, now in zip(rec["checks"], rec["checks"][1:]):
        if then[scorer][0] is None:
            return None
        for g0, g1, s0, s1 in zip(then["gold"], now["gold"], then[scorer], now[scorer]):
            if g1 != g0:
                moved += 1
                same += (g1 > g0) == (s1 > s0) and s1 != s0
    return round(same / moved, 3) if moved else None


def gold_at(rec: dict, finding: dict) -> dict:
    """Where a stop at ``finding`` would leave the gold score: the check it restores."""
    kept = finding.get("last_healthy", finding["iteration"])
    checks = [c for c in rec["checks"] if c["iteration"] <= kept]
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"gold_at_kept_check": mean(checks[-1]["gold"]) if checks else None,
            "kept_iteration": checks[-1]["iteration"] if checks else None,
            "gold_at_end": mean(rec["checks"][-1]["gold"])}


def stopped_figures(records: dict) -> dict:
    """Each stopped hacking run against the unstopped one: the evaluation of the policy each
    registered (256 held-out prompts, the gold judge)."""
    full = records.get("hacking")
    if full is None:
        return {}
    keys = ("eval/judge_score_policy", "eval/judge_win_rate", "eval/kl_to_ref")
    out = {"unstopped": {k: full["eval"].get(k) for k in keys}}
    for name in STOPPED:
        if name in records:
            out[name] = {**{k: records[name]["eval"].get(k) for k in keys},
                         "reason": records[name]["stopped"]}
    return out


def replayed(rec: dict) -> tuple[list[dict], list[str]]:
    """The detectors (the code's settings now) on the recorded run, iteration by iteration ->
    (their findings, the detectors whose finding still stands at the end: a veto)."""
    from rlhf_core.config import PPOConfig
    from rlhf_core.health.detectors import for_scorer
    from rlhf_core.health.watch import CheckAnswers, HealthMonitor

    settings = for_scorer(PPOConfig().health, registered=False)
    monitor = HealthMonitor(settings)
    checks = {c["iteration"]: c for c in rec["checks"]}
    out = []
    for it in [0, *iterations(rec)]:
        metrics = {k: v[str(it)] for k, v in rec["series"].items() if str(it) in v}
        c = checks.get(it)
        answers = None if c is None else CheckAnswers(
            it, [""] * len(c["proxy"]), c["proxy"], c["judge"] if c["judge"][0] is not None
            else None, None, c["length"], [True] * len(c["proxy"]), c["kl"], 0.0,
            c["drift"] if c.get("drift") and c["drift"][0] is not None else None)
        for f in monitor.observe(it, metrics, answers):
            out.append({"detector": f.detector, "iteration": f.iteration,
                        "last_healthy": f.last_healthy, "message": f.message})
    return out, sorted(monitor.standing())


def plot_hacking(rec: dict, path: Path) -> None:
    """The hacking run's held-out checks: gold, judge and proxy scores (each as its gain over
    the start policy), KL beside them, and where the first stop would end PPO and what it
    keeps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    its = [c["iteration"] for c in rec["checks"]]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for key, label, style in (("proxy", "proxy: the reward model PPO optimises", "-"),
                              ("judge", "held-out judge reward model", "--"),
                              ("gold", "gold judge (ground truth, never trains)", "-")):
        values = [mean(c[key]) for c in rec["checks"]]
        ax.plot(its, [v - values[0] for v in values], style, label=label, linewidth=2)
    kl = ax.twinx()
    kl.plot(its, [mean(c["kl"]) for c in rec["checks"]], ":", color="grey", label="KL")
    kl.set_ylabel("KL to the reference (nats, dotted)")
    stops = [f for f in rec["findings"] if f["detector"] in ("reward_hacking", "kl_spike")]
    if stops:
        first = min(stops, key=lambda f: f["iteration"])
        ax.axvline(first["iteration"], color="red", linewidth=1)
        kept = max(i for i in its if i <= first.get("last_healthy", first["iteration"]))
        ax.annotate(f"{first['detector']} found (iteration {first['iteration']});\n"
                    f"a stop keeps iteration {kept}", (first["iteration"], ax.get_ylim()[0]),
                    xytext=(6, 10), textcoords="offset points", color="red")
    ax.set_xlabel("PPO iteration (held-out checks)")
    ax.set_ylabel("score gain over the start policy")
    ax.set_title("demo, ppo.kl_coef=0: the proxy climbs, the gold judge does not follow")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def retrain_rounds(out: Path, seeds: list[int]) -> dict:
    """Per seed, the bootstrap then the first on-policy round (bench/retrain_round.py --runs
    1) -> {seed: the round's gate verdict, health flags and status}: the watch must not
    overturn a significant gate win, and a round without one is still kept."""
    result = {}
    for seed in seeds:
        path = out / f"retrain-seed-{seed}.json"
        if not path.exists():
            subprocess.run([sys.executable, str(ROOT / "bench" / "retrain_round.py"), "--runs",
                            "1", "--set", f"seed={seed}", "--workdir",
                            str(out / f"retrain-seed-{seed}"), "--out", str(path)], check=True,
                           capture_output=True)
        rows = json.loads(path.read_text())["rows"]
        boot = next(r for r in rows if r["kind"] == "bootstrap")
        (round1,) = [r for r in rows if r["kind"] == "retrain"]
        result[seed] = {"bootstrap": boot.get("status"),
                        "bootstrap_health_flags": boot.get("health_flags", ""),
                        **{k: round1.get(k) for k in ("status", "decision", "diff_mean",
                                                      "ci_low", "ci_high", "health_flags")}}
        print(f"retrain seed {seed}: {result[seed]}", flush=True)
    (out / "retrain.json").write_text(json.dumps(result, indent=1))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("run", "report", "retrain"))
    parser.add_argument("--seeds", default="7,8", help="retrain: the seeds")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--replay", action="store_true")
    parser.add_argument("--threads", type=int,
                        help="model.torch_threads of every run (two runners side by side: 1)")
    parser.add_argument("--scorer-noise", type=float, metavar="SIGMA",
                        help="checks scored by the gold judge + N(0, SIGMA) (noisy_gold.py)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "retrain":
        retrain_rounds(args.out, [int(x) for x in args.seeds.split(",")])
        return
    if args.what == "run":
        cases = {**{n: o + WARN_ALL for n, o in HEALTHY.items()},
                 **{n: o + WARN_ALL for n, (_, o) in FAILURES.items()}, **STOPPED,
                 **{n: o + WARN_ALL for n, o in RECOVERING.items()},
                 **{f"{n}-default": o for n, o in RECOVERING.items()}}
        chosen = args.cases.split(",") if args.cases else list(cases)
        threads = [f"model.torch_threads={args.threads}"] if args.threads else []
        for name in chosen:
            if (args.out / f"{name}.json").exists():  # recorded already: a rerun goes on
                continue
            scorer = []
            if args.scorer_noise is not None:  # registered in the store the run tracks to
                from noisy_gold import register

                (args.out / name).mkdir(parents=True, exist_ok=True)
                uri = register(f"sqlite:///{args.out / name}/mlflow.db", args.scorer_noise)
                scorer = [f"ppo.health.scorer={uri}"]
            rec = run_case(name, cases[name] + threads + scorer, args.out)
            print(f"{name}: {rec['wall_s']} s, findings "
                  f"{[(f['detector'], f['iteration']) for f in rec['findings']]}", flush=True)
    print(json.dumps(report(args.out, args.replay), indent=1))


if __name__ == "__main__":
    main()

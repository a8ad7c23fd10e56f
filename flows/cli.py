"""`rlhf` command line: run the pipeline (the demo by default) and print a summary.

    rlhf run [--config FILE] [--set key=value ...] [--resume RUN_ID]
    rlhf validate [--config FILE] [--set key=value ...]
    rlhf runs [--experiment NAME] [--limit N]
    rlhf serve [--config FILE] [--set key=value ...] [--name NAME]
    rlhf demo-batch | promote VERSION | rollback   (flows/cli_retrain.py)

MLFLOW_TRACKING_URI and PREFECT_API_URL are honoured when set; otherwise MLflow writes to
./mlflow.db and Prefect starts its local ephemeral API.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from data_checks.loading import DataError
from data_checks.validate import ValidationFailed
from flows.config import ConfigError, load_config
from tasks.registry import RegistryError

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"


def _config_for(args) -> object:
    """The user's file, else the embedded demo config; then --set overrides."""
    path = args.config or DEMO_CONFIG
    return load_config(path, args.set or [])


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def summary_text(result: dict, wall_s: float) -> str:
    """One screen: each stage, its wall time and key metrics, and the parent run."""
    lines = ["", "RLHF pipeline finished", "=" * 100,
             f"{'stage':<13}{'wall s':>8}  key metrics", "-" * 100]
    for name, stage in result["stages"].items():
        shown = ", ".join(f"{k}={_fmt(v)}" for k, v in list(stage["metrics"].items())[:4])
        wall = "skipped" if stage["skipped"] else f"{stage['wall_s']:.1f}"
        lines.append(f"{name:<13}{wall:>8}  {shown}")
    lines += ["-" * 100, f"total wall time: {wall_s:.1f} s",
              f"MLflow parent run: {result['parent_run_id']} "
              f"(experiment {result['experiment_id']}, {result['tracking_uri']})",
              f"  view: mlflow ui --backend-store-uri {result['tracking_uri']}",
              f"checkpoints: {result['workdir']}", ""]
    return "\n".join(lines)


def cmd_run(args) -> int:
    cfg = _config_for(args)
    from flows.pipeline import rlhf_pipeline  # heavy imports after the config is valid
    from flows.validate import preflight

    preflight(cfg.data)
    start = time.perf_counter()
    result = rlhf_pipeline(config=cfg, resume_run_id=args.resume)
    print(summary_text(result, time.perf_counter() - start))
    return 0


def cmd_validate(args) -> int:
    cfg = _config_for(args)
    from flows.validate import preflight, rlhf_validate

    preflight(cfg.data)
    out = rlhf_validate(config=cfg)
    counts = ", ".join(f"{k.split('/')[0]} {int(v)}" for k, v in out["metrics"].items())
    passed = ", ".join(f"{k.split('/')[0]} {v}" for k, v in out.get("figures", {}).items())
    lines = ["", "data validation PASSED", f"expectations passed: {passed}",
             f"rows kept: {counts}"]
    lines += [f"warning: {w}" for w in out["warnings"]]
    lines += [f"cleaned data: {out['data_dir']}",
              f"Data Docs: {out['data_dir']}/data_docs/index.html (GX: data_docs/gx/index.html)",
              f"MLflow parent run: {out['parent_run_id']} ({out['tracking_uri']})", ""]
    print("\n".join(lines))
    return 0


RUN_COLUMNS = (("eval/judge_win_rate", "win"), ("eval/rm_accuracy", "rm_acc"),
               ("eval/kl_to_ref", "kl"), ("eval/eos_rate_policy", "eos"))


def runs_table(experiment: str, limit: int, tracking_uri: str | None = None) -> str:
    """Recent pipeline (parent) runs of ``experiment`` with their key metrics, newest first."""
    from mlflow.tracking import MlflowClient

    from tasks.tracking import default_tracking_uri

    uri = default_tracking_uri(tracking_uri)
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        raise ConfigError(f"no MLflow experiment '{experiment}' at {uri}")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`rlhf.config_hash` != ''",
                              order_by=["attributes.start_time DESC"], max_results=limit)
    width = max([len(r.info.run_name or "") for r in runs] + [4]) + 2  # names stay whole
    head = f"{'run id':<34}{'name':<{width}}{'status':<10}{'started':<18}" + \
        "".join(f"{label:>8}" for _, label in RUN_COLUMNS)
    lines = [f"experiment '{experiment}' ({uri})", head, "-" * len(head)]
    for run in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.info.start_time / 1000))
        values = "".join(f"{run.data.metrics[k]:>8.3f}" if k in run.data.metrics else f"{'-':>8}"
                         for k, _ in RUN_COLUMNS)
        lines.append(f"{run.info.run_id:<34}{run.info.run_name or '':<{width}}"
                     f"{run.info.status:<10}{started:<18}{values}")
    if not runs:
        lines.append("(no pipeline runs yet: `rlhf run`)")
    return "\n".join(lines)


def cmd_runs(args) -> int:
    print(runs_table(args.experiment, args.limit))
    return 0


def cmd_serve(args) -> int:
    from flows.serve import serve

    cfg = _config_for(args)
    name = args.name or Path(args.config or DEMO_CONFIG).stem
    serve(cfg, name)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf", description="RLHF with PPO on Prefect + MLflow")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the whole pipeline (default: the embedded demo)")
    run.add_argument("--config", type=Path, help="YAML/JSON pipeline config")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a config field, e.g. --set ppo.kl_coef=0.1 (repeatable)")
    run.add_argument("--resume", metavar="RUN_ID", help="continue this MLflow parent run")
    run.set_defaults(func=cmd_run)
    val = sub.add_parser("validate", help="run the data gate alone (exit 1 if it fails)")
    val.add_argument("--config", type=Path, help="YAML/JSON pipeline config")
    val.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field")
    val.set_defaults(func=cmd_validate)
    runs = sub.add_parser("runs", help="list recent pipeline runs and their key metrics")
    runs.add_argument("--experiment", default="rlhf-demo", help="MLflow experiment name")
    runs.add_argument("--limit", type=int, default=10, help="how many runs (newest first)")
    runs.set_defaults(func=cmd_runs)
    srv = sub.add_parser("serve", help="serve the pipeline and retrain deployments (blocks)")
    srv.add_argument("--config", type=Path, help="served config (default: the demo)")
    srv.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field")
    srv.add_argument("--name", help="deployment name (default: the config file's stem)")
    srv.set_defaults(func=cmd_serve)
    from flows.cli_retrain import add_commands

    add_commands(sub, _config_for)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the local ephemeral server's anonymous telemetry fails loudly offline; opt back in by
    # setting the variable
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the first start of the local ephemeral API migrates its database: on a busy 2-core
    # machine that can pass Prefect's 20 s default
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, DataError, RegistryError) as err:
        print(f"rlhf: {err}", file=sys.stderr)
        return 2
    except ValidationFailed as err:
        print(f"rlhf: {err}\nnothing was trained; see the validate run's data_docs/ in MLflow",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

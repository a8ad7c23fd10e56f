"""`rlhf` command line: run the pipeline (the demo by default) and print a summary.

The pipeline's commands live here, the other wings' in their own cli modules. `rlhf --help` ends
with every command's usage line, made from the parser (:func:`commands`) so none is left out.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from cli import errors
from cli.runs import (
    DEMO_CONFIG,
    cmd_runs,
    config_command,
    config_for,
    config_options,
    resume_command,
    resume_config,
)
from tasks.pipeline.rewards import RewardSourceDown
from tasks.platform.mlflow.addresses import run_page, runs_table_url
from tasks.platform.mlflow.errors import last_parent_run
from tasks.platform.mlflow.tags import SWEEP_TAG
from tasks.platform.prefect.logins import Needs, login_out_of_uri, needs_of
from tasks.platform.prefect.preflight import check_config, check_servers
from tasks.platform.redact import redact

if TYPE_CHECKING:
    from tasks.pipeline.results import PipelineResult


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def _figure(value) -> str:
    """A count as a whole number, any other float to three decimals."""
    if isinstance(value, float):
        return f"{value:.0f}" if value.is_integer() else f"{value:.3f}"
    return str(value)


def summary_text(result: PipelineResult, wall_s: float) -> str:
    """One screen: each stage, its wall time (and on CUDA its peak GPU memory) and key
    metrics, and the parent run."""
    gpu = any(stage.peak_gpu_gb is not None for stage in result.stages.values())
    lines = ["", "RLHF pipeline finished", "=" * 100,
             f"{'stage':<13}{'wall s':>8}{'  GPU GB' if gpu else ''}  key metrics", "-" * 100]
    for name, stage in result.stages.items():
        shown = ", ".join(f"{k}={_figure(v)}" for k, v in list(stage.metrics.items())[:4])
        wall = "skipped" if stage.skipped else f"{stage.wall_s:.1f}"
        peak = "-" if stage.peak_gpu_gb is None else f"{stage.peak_gpu_gb:.1f}"
        peak = f"{peak:>8}" if gpu else ""
        lines.append(f"{name:<13}{wall:>8}{peak}  {shown}")
    lines += [f"data warning: {w}" for w in getattr(result.stages.get("validate"), "warnings",
                                                     None) or []]
    # where to look: the run's page on a tracking server, else how to start the UI
    view = run_page(result.tracking_uri, result.experiment_id, result.parent_run_id) or \
        f"mlflow ui --backend-store-uri {redact(result.tracking_uri)}"
    lines += ["-" * 100, f"total wall time: {wall_s:.1f} s",
              f"MLflow parent run: {result.parent_run_id} "
              f"(experiment {result.experiment_id}, {redact(result.tracking_uri)})",
              f"  view: {view}",
              f"  runs table: {runs_table_url(result.tracking_uri, result.experiment_id)}"]
    reg = result.registered
    if reg is not None and reg.registered:  # the versions the register stage registered
        aliases = "champion" if reg.promoted else "challenger"  # a champion is no challenger
        lines += [f"registered policy: models:/{reg.model_name}/{reg.version} ({aliases})",
                  f"registered reward model: models:/{reg.reward_model_name}/"
                  f"{reg.reward_model_version} (challenger)"]
    if reg is not None and reg.reason:
        lines.append(f"  decision: {reg.reason}")
    lines += result.notes
    lines += [f"checkpoints: {result.workdir}", ""]
    return "\n".join(lines)


def cmd_run(args) -> int:
    cfg = resume_config(args) if args.resume else config_for(args)
    check_config(cfg)
    check_servers(cfg.tracking.tracking_uri, needs=needs_of(cfg))
    from tasks.pipeline.prepare import check_outside_models

    check_outside_models(cfg)  # before Prefect starts; the flow checks again
    from data_checks.loading import read_every_source
    from flows.pipeline import rlhf_pipeline  # heavy imports after the config is valid
    from tasks.pipeline.stages.tax import check_tax_inputs

    read_every_source(cfg.data)
    check_tax_inputs(cfg)
    errors.quiet_expected_failures()
    start = time.perf_counter()
    result = rlhf_pipeline(config=cfg, resume_run_id=args.resume)
    print(summary_text(result, time.perf_counter() - start))
    return 0


def cmd_validate(args, cfg) -> int:
    check_config(cfg)
    check_servers(cfg.tracking.tracking_uri, needs=Needs(cfg.tracking.experiment))
    from data_checks.loading import read_every_source
    from flows.pipeline import rlhf_validate

    read_every_source(cfg.data)
    errors.quiet_expected_failures()
    result = rlhf_validate(config=cfg)
    out = result.data
    counts = ", ".join(f"{k.split('/')[0]} {int(v)}" for k, v in out.metrics.items())
    passed = ", ".join(f"{k.split('/')[0]} {v}" for k, v in out.figures.items())
    lines = ["", "data validation PASSED", f"expectations passed: {passed}", f"rows kept: {counts}"]
    lines += [f"warning: {w}" for w in out.warnings]
    lines += [f"cleaned data: {out.data.path}",
              f"Data Docs: {out.data.path}/data_docs/index.html (GX: data_docs/gx/index.html)",
              f"MLflow parent run: {result.parent_run_id} ({redact(result.tracking_uri)})", ""]
    print("\n".join(lines))
    return 0


def cmd_sweep(args, cfg) -> int:
    from tasks.config.pipeline_config import grid_points, parse_grid

    grid = parse_grid(args.grid or [])
    seeds = [cfg.seed + i for i in range(args.seeds)]
    points = grid_points(cfg, grid, seeds)  # every point validated before anything runs
    check_servers(cfg.tracking.tracking_uri, needs=needs_of(cfg))
    from data_checks.loading import read_every_source
    from flows.pipeline import rlhf_sweep

    read_every_source(cfg.data)
    start = time.perf_counter()
    out = rlhf_sweep(config=cfg, grid=grid, seeds=seeds, sweep_id=args.sweep_id,
                     max_concurrent=args.max_concurrent)
    print(f"\n{out.markdown}\n{len(points)} points in {time.perf_counter() - start:.1f} s; "
          f"sweep {out.sweep_id}: MLflow run {out.parent_run_id} ({redact(out.tracking_uri)}), "
          f"filter runs with tags.`{SWEEP_TAG}` = '{out.sweep_id}'")
    if out.failed:
        print(f"failed points: {'; '.join(out.failed)}", file=sys.stderr)
        return 1
    return 0


HELP_EPILOG = """where results go:
  MLflow: $MLFLOW_TRACKING_URI if set (or tracking.tracking_uri), else ./mlflow.db
  Prefect: $PREFECT_API_URL if set, else a local ephemeral API for the command's duration
  checkpoints and prepared data: tracking.workdir (default ./rlhf_runs/<run id>)
environment variables honoured: MLFLOW_TRACKING_URI, PREFECT_API_URL"""


def _version() -> str:
    import importlib.metadata as md

    try:
        return md.version("rlhf-ppo-pipeline")
    except md.PackageNotFoundError:
        return "unknown (not installed)"


def cmd_serve(args, cfg) -> int:
    from flows.serve import serve

    check_servers(cfg.tracking.tracking_uri, needs=needs_of(cfg))
    name = args.name or Path(args.config or DEMO_CONFIG).stem
    serve(cfg, name)
    return 0


def cmd_stage_worker(args) -> int:
    # the store is the one each routed stage names, unless MLFLOW_TRACKING_URI sets it here
    check_servers(None, mlflow=bool(os.environ.get("MLFLOW_TRACKING_URI")))
    from flows.stage import serve_stage

    serve_stage(args.name)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlhf", description="RLHF with PPO on Prefect + MLflow",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the whole pipeline (default: the embedded demo)")
    config_options(run, "YAML/JSON pipeline config",
                   "override a config field, e.g. --set ppo.kl_coef=0.1 (repeatable)")
    run.add_argument("--resume", metavar="RUN_ID",
                     help="continue this MLflow parent run, with the config it recorded "
                          "(--set changes a key on purpose)")
    run.add_argument("--nproc", type=int, metavar="N",
                     help="data-parallel ranks for SFT, reward model and PPO (sets model.nproc)")
    run.set_defaults(func=cmd_run)
    config_command(sub, "validate", cmd_validate, "run the data gate alone (exit 1 if it fails)",
                   "YAML/JSON pipeline config")
    sweep = config_command(sub, "sweep", cmd_sweep, "run a grid of RL settings x seeds; shared "
                           "stages once", "YAML/JSON pipeline config")
    sweep.add_argument("--grid", action="append", metavar="KEY=V1,V2",
                       help="a ppo.*/eval.* setting and its values, e.g. "
                            "--grid ppo.advantage_estimator=gae,rloo (repeatable)")
    sweep.add_argument("--seeds", type=int, default=1, help="seeds per point (seed, seed+1, ...)")
    sweep.add_argument("--max-concurrent", type=int, default=1,
                       help="points run side by side (default 1: one after another)")
    sweep.add_argument("--sweep-id", help="name of the sweep (tag rlhf.sweep_id); default by time")
    runs = sub.add_parser("runs", help="list recent pipeline runs and their key metrics")
    runs.add_argument("--experiment", default="rlhf-demo", help="MLflow experiment name")
    runs.add_argument("--limit", type=positive_int, default=10, help="how many runs (newest first)")
    runs.add_argument("--page", type=positive_int, default=1,
                      help="which page of --limit runs (1: the newest; 2: the next ones...)")
    runs.set_defaults(func=cmd_runs)
    srv = config_command(sub, "serve", cmd_serve, "serve the pipeline, retrain and collect "
                         "deployments (blocks)", "served config (default: the demo)")
    srv.add_argument("--name", help="deployment name (default: the config file's stem)")
    stw = sub.add_parser("stage-worker", help="take routed stages and nodes of pipelines run "
                         "elsewhere: serve the rlhf-stage/NAME deployment (blocks)")
    stw.add_argument("--name", required=True, help="deployment name, e.g. gpu (rlhf-stage/gpu)")
    stw.set_defaults(func=cmd_stage_worker)
    from cli.gc import add_command as add_gc
    from cli.notify import add_command as add_notify
    from cli.retrain import add_commands

    add_commands(sub)
    add_gc(sub)
    add_notify(sub)
    parser.epilog = "usage of each command (rlhf COMMAND --help for its options):\n" + \
        "\n".join(f"  {line}" for line in commands(parser)) + "\n" + HELP_EPILOG
    return parser


def commands(parser: argparse.ArgumentParser) -> list[str]:
    """The usage line of every command the parser takes (``rlhf label pull [--config CONFIG]
    ...``), nested ones in place of their group, in the order they were added."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                nested = commands(child)
                usage = " ".join(child.format_usage().split()).removeprefix("usage: ")
                found.extend(nested or [usage.replace(" [-h]", "", 1)])
    return found


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # the local ephemeral server's telemetry fails loudly offline (set the variable to opt in)
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # the ephemeral API's first start migrates its database, which can pass the default timeout
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    # MLflow prints "View run ... / View experiment ..." for every run it closes on a server:
    # the summary names the parent run once instead
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    # a stage reading another machine's outputs downloads them: no bar per artifact folder
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    login_out_of_uri()  # a login in $MLFLOW_TRACKING_URI, into MLflow's login variables
    args = build_parser().parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    try:
        with errors.stop_within_seconds(lambda signum: stop_message(args, signum)):
            return args.func(args)
    except errors.OUTAGES as err:
        print(f"\nrlhf: {err}; {continue_hint(args, err.until)}", file=sys.stderr)
        return errors.EX_TEMPFAIL
    except errors.EXPECTED as err:
        gate = isinstance(err, errors.GATE_ERRORS)
        hint = "\nnothing was trained; see the validate run's data_docs/ in MLflow" if gate else ""
        if isinstance(err, RewardSourceDown):
            hint = f"; {continue_hint(args, 'once it answers')}"
        print(f"\nrlhf: {err}{hint}", file=sys.stderr)  # a paragraph of its own
        return 1 if gate else 2
    except BaseException as err:
        if errors.prefect_gone(err):
            api = os.environ.get("PREFECT_API_URL") or "Prefect's local API"
            run_id = last_parent_run()
            kept = f"run {run_id} {KEEPS}" if run_id else "no MLflow run was opened yet"
            print(f"\nrlhf: the Prefect API at {api} stopped answering ({type(err).__name__}: "
                  f"{err}); {kept}; {continue_hint(args)}", file=sys.stderr)
            return errors.EX_TEMPFAIL
        signum = errors.stop_signal(err)
        if signum is None:
            raise
        print(f"\nrlhf: {stop_message(args, signum)}", file=sys.stderr)
        return 128 + signum


# what a pipeline run stopped mid-way keeps
KEEPS = "keeps its finished stages and the last checkpoint of the stage it was in"


def continue_hint(args, until: str = "once the server answers") -> str:
    """The command that continues the pipeline run this process opened (``until``: when)."""
    run_id = last_parent_run()
    if run_id is None or args.command != "run":
        return f"run the same command again {until}"
    return f"{until}, continue it with: {resume_command(args.argv, run_id)}"


def stop_message(args, signum: int) -> str:
    """What a stop signal leaves, and the command that continues the run."""
    name = signal.Signals(signum).name
    if args.command in ("serve", "stage-worker"):
        return f"stopped by {name}: no longer serving."
    run_id = last_parent_run()
    if run_id is None:
        return f"stopped by {name} before an MLflow run was opened; nothing was trained."
    if args.command != "run":
        return f"stopped by {name}; MLflow run {run_id} keeps what had finished."
    return (f"stopped by {name}; run {run_id} {KEEPS}; continue it with: "
            f"{resume_command(args.argv, run_id)}")

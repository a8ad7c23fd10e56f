"""The MLflow store as the command line reads it, creating no store and not retrying for minutes
against a server that does not answer: `rlhf runs` and the check of a --resume run id; and the
config a command runs with, from its --config (else the demo's) and --set options.

`rlhf run --resume <id>` continues with the config the run recorded, this command's --set on top
(recorded with the run). A --config given too must match the recorded config in every key --set
does not change, else it is refused, naming the keys, before anything runs.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from tasks.config.pipeline_config import (
    ConfigError,
    PipelineConfig,
    flatten,
    load_config,
    parse_override,
)
from tasks.platform.mlflow.addresses import default_tracking_uri, runs_table_url
from tasks.platform.mlflow.queries import StoreError, pipeline_runs, recorded_config, run_lineage
from tasks.platform.prefect.logins import Needs, login_out_of_uri
from tasks.platform.prefect.preflight import check_servers
from tasks.platform.redact import redact, redacted

DEMO_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"
CONFIG_HELP = "YAML/JSON pipeline config (default: demo)"
RUN_COLUMNS = (("eval/judge_win_rate", "win"), ("eval/rm_accuracy", "rm_acc"),
               ("eval/rm_gold_accuracy", "rm_gold"),
               ("eval/kl_to_ref", "kl"), ("eval/eos_rate_policy", "eos"))


def check_resume_id(configured: str | None, run_id: str, argv: list[str]) -> None:
    """--resume names a parent run the store has (``configured``, else MLFLOW_TRACKING_URI's,
    else ./mlflow.db), checked before Prefect starts; ``argv`` goes into the hint for a
    stage's child run id."""
    uri = default_tracking_uri(configured)
    try:
        run = run_lineage(uri, run_id)
    except StoreError as err:
        raise ConfigError(f"--resume {run_id}: the MLflow store at {redact(uri)} has no such run "
                          f"({str(err).splitlines()[0][:200]}). `rlhf runs` lists the runs; "
                          "MLFLOW_TRACKING_URI picks the store.") from None
    parent = run.parent_run_id
    if parent:
        stage = run.stage or "a stage's"
        raise ConfigError(f"--resume {run_id}: that is the `{stage}` child run of the "
                          f"pipeline run {parent}; resume the pipeline run: "
                          f"{resume_command(argv, parent)}")
    if run.status == "FINISHED":
        print(f"rlhf: run {run_id} is finished: every stage is reused as recorded and nothing "
              "trains again (a finished run's resume state, its mid-stage checkpoints, is "
              "deleted unless tracking.keep_resume_state)", file=sys.stderr)


def resume_command(args: list[str], run_id: str) -> str:
    """`rlhf ARGS` with --resume given ``run_id`` (both --resume X and --resume=X forms), as
    printed: a password in a URL among them shows as ``***``."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume="):
            out.append(redact(arg))
    return shlex.join(["rlhf", *out, "--resume", run_id])


def runs_table(experiment: str, limit: int, tracking_uri: str | None = None, page: int = 1) -> str:
    """Pipeline (parent) runs of ``experiment`` with their key metrics, newest first: page
    ``page`` of ``limit`` runs."""
    uri = default_tracking_uri(tracking_uri)
    try:
        found = pipeline_runs(uri, experiment, limit, page)
    except StoreError as err:
        raise ConfigError(str(err)) from None
    runs = found.runs
    width = max([len(r.run_name or "") for r in runs] + [4]) + 2  # names stay whole
    head = f"{'run id':<34}{'name':<{width}}{'status':<10}{'started':<18}" + \
        "".join(f"{label:>8}" for _, label in RUN_COLUMNS)
    lines = [f"experiment '{experiment}' ({redact(uri)})", head, "-" * len(head)]
    for run in runs:
        started = time.strftime("%Y-%m-%d %H:%M", time.localtime(run.start_time / 1000))
        values = "".join(f"{run.metrics[k]:>8.3f}" if k in run.metrics else f"{'-':>8}"
                         for k, _ in RUN_COLUMNS)
        status = "AWAITING" if run.approval == "pending" else run.status  # a person's answer
        lines.append(f"{run.run_id:<34}{run.run_name or '':<{width}}"
                     f"{status:<10}{started:<18}{values}")
    if not runs:
        lines.append("(no pipeline runs yet: `rlhf run`)" if page == 1 else
                     f"(no runs on page {page}: fewer than {(page - 1) * limit + 1} runs)")
    lines += [f"AWAITING {r.run_id}: candidate v{r.candidate} waits for a person's answer: "
              f"rlhf approve {r.candidate} --reason ... | rlhf reject {r.candidate} --reason ..."
              for r in runs if r.approval == "pending"]
    if found.more:
        lines.append(f"older runs: rlhf runs --experiment {experiment} --limit {limit} "
                     f"--page {page + 1}")
    where = "" if uri.startswith(("http://", "https://")) else \
        f" (after `mlflow ui --backend-store-uri {redact(uri)}`)"
    lines.append(f"in the MLflow UI{where}: {runs_table_url(uri, found.experiment_id)}")
    return "\n".join(lines)


def cmd_runs(args) -> int:
    check_servers(None, prefect=False, needs=Needs(args.experiment, write=False))
    print(runs_table(args.experiment, args.limit, page=args.page))
    return 0


SHOWN = 6  # differing keys named in the refusal; the rest are counted


def config_options(parser, config_help: str = CONFIG_HELP,
                   set_help: str = "override a field") -> None:
    """A command's --config and --set options."""
    parser.add_argument("--config", type=Path, help=config_help)
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help=set_help)


def config_for(args) -> PipelineConfig:
    """The user's file, else the embedded demo config; then --set overrides."""
    return login_out_of_uri(load_config(args.config or DEMO_CONFIG, overrides_of(args)))


def config_command(sub, name: str, fn, help: str,
                   config_help: str = CONFIG_HELP) -> argparse.ArgumentParser:
    """Subcommand ``name`` with --config and --set, run as ``fn(args, config)``."""
    parser = sub.add_parser(name, help=help)
    config_options(parser, config_help)
    parser.set_defaults(func=lambda args: fn(args, config_for(args)))
    return parser


def overrides_of(args) -> list[str]:
    """This command's --set overrides, --nproc as ``model.nproc``."""
    nproc = [] if getattr(args, "nproc", None) is None else [f"model.nproc={args.nproc}"]
    return list(args.set or []) + nproc


def config_differences(recorded: dict, cfg: PipelineConfig, overrides: list[str]) -> list[str]:
    """Keys whose value in ``cfg`` differs from the run's ``recorded`` config, those the
    overrides set left out: ``ppo.kl_coef (0.1 here, 0.05 in the run)``."""
    run = flatten(PipelineConfig.model_validate(recorded).model_dump(mode="json"))
    here = flatten(redacted(cfg.model_dump(mode="json")))
    given = [parse_override(item)[0] for item in overrides]  # keys, or sections above them
    out = []
    for key in sorted(set(run) | set(here)):
        set_by = any(key == g or key.startswith(g + ".") for g in given)
        if run.get(key) != here.get(key) and not set_by:
            out.append(f"{key} ({json.dumps(here.get(key))} here, "
                       f"{json.dumps(run.get(key))} in the run)")
    return out


def resume_config(args) -> PipelineConfig:
    """The config for ``rlhf run --resume <id>`` (module doc); ConfigError, one sentence,
    for a run the store does not have, a stage's run, or a --config that differs."""
    overrides = overrides_of(args)
    given = login_out_of_uri(load_config(args.config, overrides)) if args.config else None
    uri = given.tracking.tracking_uri if given else None
    sets = [v for k, v in map(parse_override, overrides) if k == "tracking.tracking_uri" and v]
    if given is None and sets:  # the store a --set names, its login moved into MLflow's variables
        uri = login_out_of_uri(PipelineConfig.model_validate(
            {"tracking": {"tracking_uri": str(sets[-1])}})).tracking.tracking_uri
    check_servers(uri, prefect=False)
    check_resume_id(uri, args.resume, args.argv)
    try:
        recorded, path = recorded_config(default_tracking_uri(uri), args.resume)
        run_cfg = load_config(None, overrides, base=recorded)
    except StoreError as err:
        raise ConfigError(f"--resume {args.resume}: {err}; give the run's config with "
                          "--config") from None
    except ConfigError as err:
        raise ConfigError(f"--resume {args.resume}: the config the run recorded ({path}) "
                          f"does not load here: {err}") from None
    if given is None:
        return login_out_of_uri(run_cfg)
    differ = config_differences(recorded, given, overrides)
    if differ:
        more = f" and {len(differ) - SHOWN} more" if len(differ) > SHOWN else ""
        raise ConfigError(
            f"cannot resume run {args.resume} with --config {args.config}: it differs from the "
            f"config the run recorded in MLflow ({path}) in {', '.join(differ[:SHOWN])}{more}; "
            "leave out --config to continue with the run's own config, or --set a key to "
            "change it on purpose (the change is recorded with the run).")
    return given

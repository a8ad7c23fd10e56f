"""The MLflow store as the command line reads it: `rlhf runs` (recent pipeline runs and their
key metrics) and the check of a --resume run id, both without creating a store and without
minutes of retries against a server that does not answer."""

from __future__ import annotations

import shlex
import sys
import time

from tasks.config.pipeline_config import ConfigError
from tasks.platform.mlflow.addresses import default_tracking_uri, runs_table_url
from tasks.platform.mlflow.queries import StoreError, pipeline_runs, run_lineage
from tasks.platform.prefect.logins import Needs
from tasks.platform.prefect.preflight import check_servers
from tasks.platform.redact import redact

RUN_COLUMNS = (("eval/judge_win_rate", "win"), ("eval/rm_accuracy", "rm_acc"),
               ("eval/rm_gold_accuracy", "rm_gold"),
               ("eval/kl_to_ref", "kl"), ("eval/eos_rate_policy", "eos"))


def check_resume_id(configured: str | None, run_id: str,
                    argv: list[str] | tuple = ("run",)) -> None:
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
                          f"{shlex.join(['rlhf', *resume_args(list(argv), parent)])}")
    if run.status == "FINISHED":
        print(f"rlhf: run {run_id} is finished: every stage is reused as recorded and nothing "
              "trains again (a finished run's resume state, its mid-stage checkpoints, is "
              "deleted unless tracking.keep_resume_state)", file=sys.stderr)


def resume_args(args: list[str], run_id: str) -> list[str]:
    """``args`` with --resume given ``run_id`` (both --resume X and --resume=X forms), as
    printed: a password in a URL among them shows as ``***``."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume="):
            out.append(redact(arg))
    return [*out, "--resume", run_id]


def runs_table(experiment: str, limit: int, tracking_uri: str | None = None,
               page: int = 1) -> str:
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

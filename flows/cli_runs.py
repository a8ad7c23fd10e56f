"""The MLflow store as the command line reads it: `rlhf runs` (recent pipeline runs and their
key metrics) and the check of a --resume run id, both without creating a store and without
minutes of retries against a server that does not answer."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

from flows.config import ConfigError
from flows.preflight import check_servers
from tasks.tracking import runs_table_url

RUN_COLUMNS = (("eval/judge_win_rate", "win"), ("eval/rm_accuracy", "rm_acc"),
               ("eval/rm_gold_accuracy", "rm_gold"),
               ("eval/kl_to_ref", "kl"), ("eval/eos_rate_policy", "eos"))


def read_only_client(uri: str, timeout_s: int = 10):
    """An MLflow client that creates no store (a missing SQLite file is an error) and gives
    up on an unreachable server after ``timeout_s`` instead of retrying for minutes."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise ConfigError(f"no MLflow store at {uri}: nothing has run here yet (`rlhf run` "
                          "creates it), or set MLFLOW_TRACKING_URI to the store you mean")
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


def check_resume_id(cfg, run_id: str, argv: list[str] | tuple = ("run",)) -> None:
    """--resume names a parent run the store has (checked before Prefect starts); ``argv``,
    the command's arguments, are repeated in the hint for a stage's child run id."""
    from mlflow.exceptions import MlflowException

    from tasks.tracking import default_tracking_uri

    uri = default_tracking_uri(cfg.tracking.tracking_uri)
    try:
        run = read_only_client(uri).get_run(run_id)
    except (MlflowException, ConfigError) as err:
        raise ConfigError(f"--resume {run_id}: the MLflow store at {uri} has no such run "
                          f"({str(err).splitlines()[0][:200]}). `rlhf runs` lists the runs; "
                          "MLFLOW_TRACKING_URI picks the store.") from None
    parent = run.data.tags.get("mlflow.parentRunId")
    if parent:
        stage = run.data.tags.get("rlhf.stage", run.info.run_name or "a stage's")
        raise ConfigError(f"--resume {run_id}: that is the `{stage}` child run of the "
                          f"pipeline run {parent}; resume the pipeline run: "
                          f"{shlex.join(['rlhf', *resume_args(list(argv), parent)])}")


def resume_args(args: list[str], run_id: str) -> list[str]:
    """``args`` with --resume given ``run_id`` (both --resume X and --resume=X forms)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--resume":
            skip = True
        elif not arg.startswith("--resume="):
            out.append(arg)
    return [*out, "--resume", run_id]


def runs_table(experiment: str, limit: int, tracking_uri: str | None = None) -> str:
    """Recent pipeline (parent) runs of ``experiment`` with their key metrics, newest first."""
    from mlflow.exceptions import MlflowException

    from tasks.tracking import default_tracking_uri

    uri = default_tracking_uri(tracking_uri)
    client = read_only_client(uri)
    try:
        return _runs_table(client, uri, experiment, limit)
    except (MlflowException, OSError) as err:
        raise ConfigError(f"cannot read runs from the MLflow store at {uri}: "
                          f"{str(err).splitlines()[0][:300]}") from None


def _runs_table(client, uri: str, experiment: str, limit: int) -> str:
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
    where = "" if uri.startswith(("http://", "https://")) else \
        f" (after `mlflow ui --backend-store-uri {uri}`)"
    lines.append(f"in the MLflow UI{where}: {runs_table_url(uri, exp.experiment_id)}")
    return "\n".join(lines)


def cmd_runs(args) -> int:
    check_servers(None, prefect=False)
    print(runs_table(args.experiment, args.limit))
    return 0

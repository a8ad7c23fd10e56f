"""The pipeline's parent run: found, created or reopened, ended, and what it holds beside
its stages' runs (plots, the judge split, a sweep's summary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

from tasks.platform.mlflow.runs import RunContext, find_stage_run, log_params, set_tags
from tasks.platform.mlflow.tags import PARENT_TAG, RESUMED_CONFIG_HASH_TAG

PLOTS = "plots"  # the parent run's artifact folder of figures


def parent_runs(client: MlflowClient, experiment_id: str, filter_string: str) -> list:
    """Parent runs among the experiment's latest runs matching ``filter_string``, newest first."""
    runs = client.search_runs([experiment_id], filter_string=filter_string, max_results=20,
                              order_by=["attributes.start_time DESC"])
    return [r for r in runs if PARENT_TAG not in r.data.tags]


def run_to_resume(client: MlflowClient, run_id: str):
    """The run ``run_id`` (a clear MlflowException for a wrong id)."""
    return client.get_run(run_id)


def reopen_run(client: MlflowClient, run_id: str) -> None:
    client.update_run(run_id, status="RUNNING")


def end_run(client: MlflowClient, run_id: str, status: str) -> None:
    client.set_terminated(run_id, status=status)


def end_parent_run(ctx: RunContext, status: str) -> None:
    end_run(ctx.client(), ctx.parent_run_id, status)


def keep_resumed_config(client: MlflowClient, run_id: str, config: dict,
                        config_hash: str) -> None:
    """Keep the config a resume with changed settings runs with, beside the first one."""
    client.log_dict(run_id, config, f"config/resumed_config_{config_hash}.json")
    set_tags(client, run_id, {RESUMED_CONFIG_HASH_TAG: config_hash})


def create_parent_run(client: MlflowClient, experiment_id: str, run_name: str,
                      params: dict[str, Any], tags: dict[str, str], config: dict) -> str:
    """A new pipeline run with its parameters, tags and resolved config -> its id."""
    run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
    log_params(client, run_id, params)
    set_tags(client, run_id, tags)
    client.log_dict(run_id, config, "config/resolved_config.json")
    return run_id


def stage_metric_histories(ctx: RunContext, stage: str, keys: list[str]) -> dict | None:
    """{key: [Metric]} over the steps of the stage's run; None when the stage has no run."""
    run = find_stage_run(ctx, stage)
    if run is None:
        return None
    client = ctx.client()
    return {key: client.get_metric_history(run.info.run_id, key) for key in keys}


def log_parent_plot(ctx: RunContext, path: str) -> None:
    """A figure into the parent run's ``plots/``."""
    ctx.client().log_artifact(ctx.parent_run_id, path, PLOTS)


def log_parent_folder(ctx: RunContext, folder: str | Path, artifact_path: str) -> None:
    ctx.client().log_artifacts(ctx.parent_run_id, str(folder), artifact_path)


def log_sweep_summary(ctx: RunContext, rows: list[dict], groups: list[dict],
                      markdown: str) -> None:
    """A sweep's tables and markdown summary on the sweep's run (``sweep/``)."""
    import pandas as pd

    client = ctx.client()
    client.log_table(ctx.parent_run_id, data=pd.DataFrame(rows), artifact_file="sweep/points.json")
    if groups:
        client.log_table(ctx.parent_run_id, data=pd.DataFrame(groups),
                         artifact_file="sweep/summary.json")
    client.log_text(ctx.parent_run_id, markdown, "sweep/summary.md")

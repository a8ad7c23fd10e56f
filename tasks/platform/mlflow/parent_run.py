"""The pipeline's parent run: found, created, reopened or ended, and a sweep's summary on it."""

from __future__ import annotations

from typing import Any

from mlflow.tracking import MlflowClient

from tasks.config.pipeline_config import flatten
from tasks.platform.mlflow.runs import RunContext, find_stage_run, log_params, set_tags
from tasks.platform.mlflow.tags import CONFIG_HASH_TAG, PARENT_TAG, RESUMED_CONFIG_HASH_TAG

PLOTS = "plots"  # the parent run's artifact folder of figures


def parent_runs(client: MlflowClient, experiment_id: str, tag: str, value: str) -> list:
    """Parent runs among the experiment's latest runs whose ``tag`` is ``value``, newest first."""
    runs = client.search_runs([experiment_id], filter_string=f"tags.`{tag}` = '{value}'",
                              max_results=20, order_by=["attributes.start_time DESC"])
    return [r for r in runs if PARENT_TAG not in r.data.tags]


def run_to_resume(client: MlflowClient, run_id: str):
    """The run ``run_id`` (a clear MlflowException for a wrong id)."""
    return client.get_run(run_id)


def reopen_run(client: MlflowClient, run, config: dict[str, Any], config_hash: str) -> None:
    """Mark ``run`` RUNNING again; resumed with changed settings (another config hash), it
    keeps the config it continues with beside the first one."""
    run_id = run.info.run_id
    client.update_run(run_id, status="RUNNING")
    if run.data.tags.get(CONFIG_HASH_TAG) != config_hash:
        client.log_dict(run_id, config, f"config/resumed_config_{config_hash}.json")
        set_tags(client, run_id, {RESUMED_CONFIG_HASH_TAG: config_hash})


def end_run(client: MlflowClient, run_id: str, status: str) -> None:
    client.set_terminated(run_id, status=status)


def create_parent_run(client: MlflowClient, experiment_id: str, run_name: str,
                      tags: dict[str, str], config: dict[str, Any]) -> str:
    """A new pipeline run with its tags and resolved config (and as parameters) -> its id."""
    run_id = client.create_run(experiment_id, run_name=run_name).info.run_id
    log_params(client, run_id, flatten(config))
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


def log_sweep_summary(ctx: RunContext, rows: list[dict], groups: list[dict], markdown: str) -> None:
    """A sweep's tables and markdown summary on the sweep's run (``sweep/``)."""
    import pandas as pd

    client = ctx.client()
    client.log_table(ctx.parent_run_id, data=pd.DataFrame(rows), artifact_file="sweep/points.json")
    if groups:
        client.log_table(ctx.parent_run_id, data=pd.DataFrame(groups),
                         artifact_file="sweep/summary.json")
    client.log_text(ctx.parent_run_id, markdown, "sweep/summary.md")

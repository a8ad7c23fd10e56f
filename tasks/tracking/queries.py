"""Read-only look-ups for the CLI (`rlhf runs`, the `--resume` check): they never create a
store, and say in one sentence what the store could not answer."""

from __future__ import annotations

import os
from pathlib import Path

from mlflow.tracking import MlflowClient
from pydantic import BaseModel, ConfigDict

from tasks.tracking.tags import CONFIG_HASH_TAG, PARENT_TAG, STAGE_TAG


class StoreError(ValueError):
    """A read-only look-up the MLflow store cannot answer: no store at a local path, no such
    run or experiment, or a store that refused the read."""


def _read_only_client(uri: str, timeout_s: int = 10) -> MlflowClient:
    """An MLflow client that creates no store (a missing SQLite file is a StoreError) and
    gives up on an unreachable server after ``timeout_s`` instead of retrying for minutes."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise StoreError(f"no MLflow store at {uri}: nothing has run here yet (`rlhf run` "
                         "creates it), or set MLFLOW_TRACKING_URI to the store you mean")
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(timeout_s))
    return MlflowClient(uri)


class RunPlace(BaseModel):
    """Where a stored run sits: the pipeline run it is a stage of (None: a pipeline run)
    and its stage (its stage tag, else its name); its status (FINISHED, FAILED...)."""

    model_config = ConfigDict(frozen=True)
    parent_run_id: str | None
    stage: str | None
    status: str


class PipelineRun(BaseModel):
    """One pipeline (parent) run as `rlhf runs` lists it; ``start_time`` in ms."""

    model_config = ConfigDict(frozen=True)
    run_id: str
    run_name: str | None
    status: str
    start_time: int
    metrics: dict[str, float]


class PipelineRuns(BaseModel):
    """An experiment's id and one page of its pipeline runs, newest first; ``more``: a
    later page has runs."""

    model_config = ConfigDict(frozen=True)
    experiment_id: str
    runs: list[PipelineRun]
    more: bool = False


def run_lineage(tracking_uri: str, run_id: str) -> RunPlace:
    """Where a stored run sits, read without creating a store; StoreError when the store
    has no such run (or is not there)."""
    from mlflow.exceptions import MlflowException

    try:
        run = _read_only_client(tracking_uri).get_run(run_id)
    except MlflowException as err:
        raise StoreError(str(err)) from None
    tags = run.data.tags
    return RunPlace(parent_run_id=tags.get(PARENT_TAG),
                    stage=tags.get(STAGE_TAG, run.info.run_name), status=run.info.status)


def pipeline_runs(tracking_uri: str, experiment: str, limit: int,
                  page: int = 1) -> PipelineRuns:
    """The experiment's id and page ``page`` (``limit`` runs each) of its pipeline (parent)
    runs, newest first, selected by the store (a tag filter and MLflow's page tokens: the
    runs of earlier pages are skipped, not read), without creating a store; StoreError when
    there is no such store or experiment, or the store cannot be read."""
    from mlflow.exceptions import MlflowException

    client = _read_only_client(tracking_uri)
    try:
        exp = client.get_experiment_by_name(experiment)
        if exp is None:
            raise StoreError(f"no MLflow experiment '{experiment}' at {tracking_uri}")
        runs, token = [], None
        for n in range(1, page + 1):
            found = client.search_runs([exp.experiment_id],
                                       filter_string=f"tags.`{CONFIG_HASH_TAG}` != ''",
                                       order_by=["attributes.start_time DESC"],
                                       max_results=limit, page_token=token)
            token = found.token
            if n == page:
                runs = found
            elif not token:
                break  # fewer pages than asked for
    except (MlflowException, OSError) as err:
        raise StoreError(f"cannot read runs from the MLflow store at {tracking_uri}: "
                         f"{str(err).splitlines()[0][:300]}") from None
    return PipelineRuns(experiment_id=exp.experiment_id, more=bool(token), runs=[PipelineRun(
        run_id=r.info.run_id, run_name=r.info.run_name, status=r.info.status,
        start_time=r.info.start_time, metrics=dict(r.data.metrics)) for r in runs])

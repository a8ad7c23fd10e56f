"""Read-only look-ups for the CLI that never create a store and say in one sentence what it could
not answer. `rlhf runs` reads a local SQLite store with plain SQL, skipping MLflow's imports."""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict

from tasks.platform.mlflow.tags import (
    APPROVAL_STATUS_TAG,
    APPROVAL_VERSION_TAG,
    CONFIG_HASH_TAG,
    MLFLOW_RUN_NAME_TAG,
    PARENT_TAG,
    RESUMED_CONFIG_HASH_TAG,
    STAGE_TAG,
)

if TYPE_CHECKING:  # MLflow is loaded by the look-ups that use it, not by `rlhf runs`
    from mlflow.tracking import MlflowClient


class StoreError(ValueError):
    """A read-only look-up the MLflow store cannot answer."""


def _read_only_client(uri: str) -> MlflowClient:
    """An MLflow client that creates no store and gives up on a lost server after 10 s."""
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        raise StoreError(f"no MLflow store at {uri}: nothing has run here yet (`rlhf run` "
                         "creates it), or set MLFLOW_TRACKING_URI to the store you mean")
    if uri.startswith(("http://", "https://")):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


class RunPlace(BaseModel):
    """A stored run's pipeline run (None: it is one), stage and status."""

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
    approval: str | None = None  # a retrain's candidate: pending, approved, rejected, timed-out
    candidate: str | None = None  # that candidate's version


class PipelineRuns(BaseModel):
    """A page of an experiment's pipeline runs, newest first (``experiment_id`` None: no such)."""

    model_config = ConfigDict(frozen=True)
    experiment_id: str | None
    runs: list[PipelineRun]
    more: bool = False


def run_lineage(tracking_uri: str, run_id: str) -> RunPlace:
    """Where a stored run sits; StoreError when the store has no such run."""
    from mlflow.exceptions import MlflowException

    try:
        run = _read_only_client(tracking_uri).get_run(run_id)
    except MlflowException as err:
        raise StoreError(str(err)) from None
    tags = run.data.tags
    return RunPlace(parent_run_id=tags.get(PARENT_TAG),
                    stage=tags.get(STAGE_TAG, run.info.run_name), status=run.info.status)


def recorded_config(tracking_uri: str, run_id: str) -> tuple[dict, str]:
    """The config a pipeline run last ran with (its last changed resume's, else its first)
    -> (the config as JSON, its artifact path); StoreError when unreadable."""
    from mlflow.exceptions import MlflowException

    client = _read_only_client(tracking_uri)
    try:
        resumed = client.get_run(run_id).data.tags.get(RESUMED_CONFIG_HASH_TAG)
    except MlflowException as err:
        raise StoreError(str(err).splitlines()[0][:200]) from None
    path = f"config/resumed_config_{resumed}.json" if resumed else "config/resolved_config.json"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return json.loads(Path(client.download_artifacts(run_id, path, tmp)).read_text()), path
    except (MlflowException, OSError, ValueError) as err:
        raise StoreError(f"run {run_id} has no readable {path} in MLflow "
                         f"({str(err).splitlines()[0][:200]})") from None


def pipeline_runs(tracking_uri: str, experiment: str, limit: int, page: int = 1) -> PipelineRuns:
    """Page ``page`` (``limit`` runs each) of the experiment's pipeline runs, newest first,
    selected by the store; StoreError when the store or experiment cannot be read."""
    path = sqlite_file(tracking_uri)
    if path is not None and not path.exists():
        _read_only_client(tracking_uri)  # the StoreError that says there is no store
    found = None if path is None else _pipeline_runs_sql(path, experiment, limit, page)
    if found is None:
        from mlflow.exceptions import MlflowException

        try:
            found = _pipeline_runs_client(_read_only_client(tracking_uri), experiment, limit, page)
        except (MlflowException, OSError) as err:
            raise StoreError(f"cannot read runs from the MLflow store at {tracking_uri}: "
                             f"{str(err).splitlines()[0][:300]}") from None
    if found.experiment_id is None:
        raise StoreError(f"no MLflow experiment '{experiment}' at {tracking_uri}")
    return found


def _pipeline_runs_client(client: MlflowClient, experiment: str, limit: int,
                          page: int) -> PipelineRuns:
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return PipelineRuns(experiment_id=None, runs=[])
    runs, token = [], None
    for n in range(1, page + 1):
        found = client.search_runs([exp.experiment_id], max_results=limit, page_token=token,
                                   filter_string=f"tags.`{CONFIG_HASH_TAG}` != ''",
                                   order_by=["attributes.start_time DESC"])
        token = found.token
        if n == page:
            runs = found
        elif not token:
            break  # fewer pages than asked for
    return PipelineRuns(experiment_id=exp.experiment_id, more=bool(token), runs=[PipelineRun(
        run_id=r.info.run_id, run_name=r.info.run_name, status=r.info.status,
        start_time=r.info.start_time, metrics=dict(r.data.metrics),
        approval=r.data.tags.get(APPROVAL_STATUS_TAG),
        candidate=r.data.tags.get(APPROVAL_VERSION_TAG)) for r in runs])

RUN_PAGE_SQL = """
SELECT r.run_uuid, r.name, r.status, r.start_time,
       (SELECT n.value FROM tags n WHERE n.run_uuid = r.run_uuid AND n.key = ?),
       (SELECT a.value FROM tags a WHERE a.run_uuid = r.run_uuid AND a.key = ?),
       (SELECT v.value FROM tags v WHERE v.run_uuid = r.run_uuid AND v.key = ?)
FROM runs r
WHERE r.experiment_id = ? AND r.lifecycle_stage = 'active'
  AND EXISTS (SELECT 1 FROM tags t WHERE t.run_uuid = r.run_uuid AND t.key = ?
              AND t.value != '')
ORDER BY CASE WHEN r.start_time IS NULL THEN 1 ELSE 0 END, r.start_time DESC, r.run_uuid
LIMIT ? OFFSET ?"""


def sqlite_file(uri: str) -> Path | None:
    """The file of a plain ``sqlite:///`` URI, else None (also for a URI with options)."""
    if not uri.startswith("sqlite:///") or "?" in uri:
        return None
    return Path(uri.removeprefix("sqlite:///"))


def _pipeline_runs_sql(path: Path, experiment: str, limit: int, page: int) -> PipelineRuns | None:
    """``pipeline_runs`` read with SQL from MLflow's tables, ordered and paged as its
    search_runs does; None when the file does not fit (then MLflow's client reads it)."""
    try:
        con = sqlite3.connect(f"file:{urllib.parse.quote(str(path))}?mode=ro", uri=True, timeout=10)
    except sqlite3.Error:
        return None
    try:
        with con:
            ids = con.execute("SELECT experiment_id FROM experiments WHERE name = ?",
                              (experiment,)).fetchall()
            if len(ids) != 1:
                return None if ids else PipelineRuns(experiment_id=None, runs=[])
            rows = con.execute(RUN_PAGE_SQL, (
                MLFLOW_RUN_NAME_TAG, APPROVAL_STATUS_TAG, APPROVAL_VERSION_TAG, ids[0][0],
                CONFIG_HASH_TAG, limit + 1, (page - 1) * limit)).fetchall()
            metrics: dict[str, dict[str, float]] = {row[0]: {} for row in rows[:limit]}
            marks = ",".join("?" * len(metrics))
            for run_id, key, value, is_nan in con.execute(
                    "SELECT run_uuid, key, value, is_nan FROM latest_metrics "
                    f"WHERE run_uuid IN ({marks})", list(metrics)):
                metrics[run_id][key] = float("nan") if is_nan else float(value)
    except sqlite3.Error:
        return None
    finally:
        con.close()
    return PipelineRuns(experiment_id=str(ids[0][0]), more=len(rows) > limit, runs=[
        PipelineRun(run_id=run_id, run_name=name or tag_name, status=status, start_time=start,
                    metrics=metrics[run_id], approval=approval, candidate=version)
        for run_id, name, status, start, tag_name, approval, version in rows[:limit]])

"""What `rlhf gc` asks the MLflow store, and MLflow's own `mlflow gc` for deleted runs. Every
look-up filters server-side, never by reading every run."""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import suppress
from pathlib import Path
from urllib.parse import unquote, urlparse

from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException
from pydantic import BaseModel, ConfigDict

from tasks.platform.mlflow.addresses import default_tracking_uri
from tasks.platform.mlflow.errors import PurgeFailed
from tasks.platform.mlflow.registry import (
    CANDIDATE,
    CHALLENGER,
    CHAMPION,
    PREVIOUS,
    alias_version,
)
from tasks.platform.mlflow.runs import experiment_client, tracking_client
from tasks.platform.mlflow.tags import (
    COLLECTION_TAG,
    PARENT_TAG,
    PIPELINE_RUN_TAG,
    PULLED_ALL_TAG,
    VALIDATE_ONLY_TAG,
    stage_run_tag,
)
from tasks.retrain.store import CONSUMED_COPY, every_run

CHUNK = 100  # run ids per `IN (...)` filter
ALIASES = (CHAMPION, CHALLENGER, PREVIOUS, CANDIDATE)


class StoredRun(BaseModel):
    """A run as gc weighs it (``end_time`` in ms; None while running)."""

    model_config = ConfigDict(frozen=True)
    run_id: str
    experiment_id: str
    parent_run_id: str | None  # a stage run's pipeline run
    status: str
    deleted: bool
    end_time: int | None
    validate_only: bool = False
    artifact_uri: str | None = None
    deleted_time: int | None = None  # ms; a deleted run's, where the store records it


def _stored(run) -> StoredRun:
    return StoredRun(run_id=run.info.run_id, experiment_id=run.info.experiment_id,
                     parent_run_id=run.data.tags.get(PARENT_TAG), status=run.info.status,
                     deleted=run.info.lifecycle_stage == "deleted", end_time=run.info.end_time,
                     validate_only=run.data.tags.get(VALIDATE_ONLY_TAG) == "true",
                     artifact_uri=run.info.artifact_uri)


def _experiment_ids(client, view_type: int = ViewType.ALL) -> list[str]:
    return [e.experiment_id for e in client.search_experiments(view_type=view_type)]


def store_missing(configured: str | None) -> str | None:
    """A sentence when the local store is missing, else None; gc never creates a store."""
    uri = default_tracking_uri(configured)
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return (f"no MLflow store at {uri}: nothing has run here yet, or set "
                "MLFLOW_TRACKING_URI (or tracking.tracking_uri) to the store you mean")
    return None


def stored_runs(tracking_uri: str, run_ids: list[str]) -> dict[str, StoredRun]:
    """The runs of ``run_ids`` the store has (deleted ones too), by id."""
    client = tracking_client(tracking_uri)
    experiments = _experiment_ids(client)
    found: dict[str, StoredRun] = {}
    for start in range(0, len(run_ids), CHUNK):
        ids = ", ".join(f"'{r}'" for r in run_ids[start:start + CHUNK])
        for run in client.search_runs(experiments, f"attributes.run_id IN ({ids})",
                                      run_view_type=ViewType.ALL, max_results=CHUNK):
            found[run.info.run_id] = _stored(run)
    return found


def alias_runs(tracking_uri: str, models: tuple[str, ...]) -> dict[str, str]:
    """Run id -> the alias that needs it: each aliased version's register, pipeline and
    lineage stage runs, with their parents."""
    client = tracking_client(tracking_uri)
    need: dict[str, str] = {}
    for name in models:
        for alias in ALIASES:
            version = alias_version(client, name, alias)
            if version is None:
                continue
            why = f"{name}@{alias} (v{version.version})"
            runs = [version.run_id, version.tags.get(PIPELINE_RUN_TAG)] + [
                version.tags.get(stage_run_tag(s)) for s in ("sft", "reward_model", "ppo")]
            for run_id in filter(None, runs):
                need.setdefault(run_id, why)
                with suppress(MlflowException):
                    parent = client.get_run(run_id).data.tags.get(PARENT_TAG)
                    if parent:
                        need.setdefault(parent, why)
    return need


def deleted_runs(tracking_uri: str) -> list[StoredRun]:
    """Every run marked deleted, with its deletion time where the store records it."""
    client = tracking_client(tracking_uri)
    out = [_stored(r) for r in every_run(client, _experiment_ids(client),
                                         run_view_type=ViewType.DELETED_ONLY)]
    if not out or tracking_uri.startswith(("http://", "https://")):
        return out
    from mlflow.store.tracking.dbmodels.models import SqlRun
    from mlflow.tracking._tracking_service.utils import _get_store

    store = _get_store(tracking_uri)  # only a database store records the deletion time (ms)
    if not hasattr(store, "ManagedSessionMaker"):
        return out
    ids, when = [r.run_id for r in out], {}
    with store.ManagedSessionMaker() as session:
        for start in range(0, len(ids), CHUNK):
            rows = session.query(SqlRun.run_uuid, SqlRun.deleted_time).filter(
                SqlRun.run_uuid.in_(ids[start:start + CHUNK])).all()
            when.update({run_id: int(t) for run_id, t in rows if t is not None})
    return [r.model_copy(update={"deleted_time": when.get(r.run_id)}) for r in out]


def stage_runs(tracking_uri: str, parents: list[str]) -> dict[str, list[StoredRun]]:
    """Every run under each of ``parents``, recursively, active or deleted."""
    client = tracking_client(tracking_uri)
    experiments = _experiment_ids(client)
    out: dict[str, list[StoredRun]] = {}
    for parent in parents:
        found, todo = [], [parent]
        while todo:
            above = todo.pop()
            runs = client.search_runs(experiments, f"tags.`{PARENT_TAG}` = '{above}'",
                                      run_view_type=ViewType.ALL, max_results=1000)
            found += [_stored(r) for r in runs]
            todo += [r.info.run_id for r in runs]
        out[parent] = found
    return out


def deleted_experiments(tracking_uri: str) -> list[str]:
    """Experiments marked deleted: `mlflow gc` removes them, with their runs, too."""
    return _experiment_ids(tracking_client(tracking_uri), ViewType.DELETED_ONLY)


def purge_runs(tracking_uri: str, run_ids: list[str]) -> None:
    """Purge ``run_ids`` with `mlflow gc` (marking active ones deleted first). Only for a
    store this machine opens; PurgeFailed when MLflow's gc fails."""
    client = tracking_client(tracking_uri)
    present = stored_runs(tracking_uri, run_ids)
    for run in present.values():
        if not run.deleted:
            client.delete_run(run.run_id)
    ids = [r for r in run_ids if r in present]
    if not ids:
        return
    proc = subprocess.run(
        [sys.executable, "-m", "mlflow", "gc", "--backend-store-uri", tracking_uri,
         "--tracking-uri", tracking_uri, "--run-ids", ",".join(ids)],
        capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        left = stored_runs(tracking_uri, ids)
        if left:
            why = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise PurgeFailed(f"MLflow's gc of {len(left)} deleted run(s) at {tracking_uri} "
                              f"failed ({why[:300]}); they stay marked deleted")
    for path in filter(None, (local_folder(r.artifact_uri) for r in present.values())):
        # the run's local artifact folder, which MLflow's gc leaves empty, deepest first
        folder = path.parent if path.name == "artifacts" else path
        for root, _, _ in sorted(os.walk(folder), key=lambda w: -len(w[0])):
            with suppress(OSError):
                Path(root).rmdir()  # only an empty folder


def local_folder(artifact_uri: str | None) -> Path | None:
    """A run's local artifact folder (None: its artifacts are elsewhere)."""
    if not artifact_uri or not artifact_uri.startswith(("file://", "/")):
        return None
    return Path(unquote(urlparse(artifact_uri).path))


def keeps_consumed_copy(tracking_uri: str, run_id: str, digest: str) -> bool:
    client = tracking_client(tracking_uri)
    return bool(client.list_artifacts(run_id, f"{CONSUMED_COPY}/{digest}"))


def mark_pulled_all(tracking_uri: str, experiment: str, cid: str, pairs: int) -> None:
    """Tag collection ``cid``'s run (where there is one) as pulled in full, so `rlhf label
    pull` skips it without its ``pulls/`` record."""
    client, exp_id = experiment_client(tracking_uri, experiment)
    runs = [] if exp_id is None else client.search_runs(
        [exp_id], f"tags.`{COLLECTION_TAG}` = '{cid}'", max_results=1)
    if runs:
        client.set_tag(runs[0].info.run_id, PULLED_ALL_TAG, str(pairs))

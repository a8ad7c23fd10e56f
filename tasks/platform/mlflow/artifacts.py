"""Stage outputs every worker can reach: an MLflow artifact URI beside each local path, so
:func:`local_copy` can download what this machine lacks."""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path

import mlflow.artifacts
from pydantic import BaseModel, ConfigDict

from tasks.platform.mlflow.guarded import GuardedClient
from tasks.platform.mlflow.runs import RunContext
from tasks.platform.mlflow.spool import drain_all

CACHE = "artifact_cache"


class Artifact(BaseModel):
    """A stage output: ``path`` where written, ``uri`` its MLflow copy (None: given outside)."""

    model_config = ConfigDict(frozen=True)
    path: str
    uri: str | None = None


class StageOutputMissing(FileNotFoundError):
    """A stage output that is neither on this machine nor downloadable from MLflow."""


def publish_path(ctx: RunContext, run_id: str, path: Path, artifact_path: str,
                 logged: bool = False) -> Artifact:
    """Log ``path`` as artifact ``artifact_path`` of the stage's run (unless already
    ``logged``) -> the path and its URI. For a file, ``artifact_path`` ends with its name."""
    drain_all(ctx.outage_limit_s)  # the stage's spooled metrics and tables go first
    if not logged:
        client = ctx.client()
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path)
        else:
            if Path(artifact_path).name != path.name:
                raise ValueError(f"artifact {artifact_path} must end with {path.name}")
            folder = str(Path(artifact_path).parent)
            client.log_artifact(run_id, str(path), None if folder == "." else folder)
    return Artifact(path=str(path), uri=f"runs:/{run_id}/{artifact_path}")


def local_copy(ctx: RunContext, artifact: Artifact, what: str) -> Path:
    """The local path of a stage output: as recorded when it exists here, else its artifact
    from MLflow, cached under the workdir. ``what`` names it in the error."""
    recorded = artifact.path
    if recorded and Path(recorded).exists():
        return Path(recorded)
    if not artifact.uri:
        raise StageOutputMissing(f"{what}: {recorded} does not exist on this machine and "
                                 "the stage recorded no artifact URI for it")
    uri = artifact.uri
    target = Path(ctx.workdir) / CACHE / hashlib.sha256(uri.encode()).hexdigest()[:16]
    if not target.exists():
        client = ctx.client()
        if isinstance(client, GuardedClient):  # a server away: a bounded wait for it first
            client.wait_for_server(f"downloading {uri}")
        tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}")
        tmp.mkdir(parents=True)
        try:
            mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(tmp),
                                                tracking_uri=ctx.tracking_uri)
            got = list(tmp.iterdir())
            if len(got) != 1 or (got[0].is_dir() and not any(got[0].iterdir())):
                raise FileNotFoundError(f"the download holds {[p.name for p in got]}")
        except Exception as err:  # noqa: BLE001 - whatever the store raised, say what was wanted
            shutil.rmtree(tmp, ignore_errors=True)
            raise StageOutputMissing(f"{what}: {recorded} does not exist on this machine and "
                                     f"its artifact {uri} could not be downloaded: {err}") from err
        try:
            tmp.rename(target)  # atomic, so no one sees half a copy; another may have won
        except OSError:
            if not target.exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    (entry,) = target.iterdir()  # the one folder or file the artifact is
    return entry


# StageContext's plain writes on a stage's run (files, text, tables that are no stage output)

def log_artifacts(client, run_id: str, folder: str | Path, artifact_path: str) -> None:
    client.log_artifacts(run_id, str(folder), artifact_path)


def log_artifact(client, run_id: str, path: str | Path, folder: str) -> None:
    client.log_artifact(run_id, str(path), folder)


def log_text(client, run_id: str, text: str, artifact_file: str) -> None:
    client.log_text(run_id, text, artifact_file)


def log_table(client, run_id: str, rows, artifact_file: str) -> None:
    client.log_table(run_id, data=rows, artifact_file=artifact_file)

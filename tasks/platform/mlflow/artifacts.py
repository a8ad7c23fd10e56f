"""A run's files in MLflow. Stage outputs every worker can reach: an MLflow artifact URI beside
each local path, so :func:`local_copy` can download what this machine lacks. Data files as
dataset inputs of runs (the run's "Datasets" panel), tagged with the context they served in."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import mlflow.artifacts
import mlflow.data
import numpy as np
import pandas as pd
from mlflow.data.digest_utils import get_normalized_md5_digest
from mlflow.entities import Dataset, DatasetInput, InputTag, LoggedModelInput
from mlflow.tracking import MlflowClient
from pydantic import BaseModel, ConfigDict

from tasks.platform.mlflow.guarded import GuardedClient
from tasks.platform.mlflow.runs import RunContext, retry_unique_key
from tasks.platform.mlflow.spool import drain_all
from tasks.platform.mlflow.tags import DATASET_CONTEXT_TAG

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
    recorded, uri = artifact.path, artifact.uri
    if recorded and Path(recorded).exists():
        return Path(recorded)
    if not uri:
        raise StageOutputMissing(f"{what}: {recorded} does not exist on this machine and "
                                 "the stage recorded no artifact URI for it")
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


# ---- data files as dataset inputs ----------------------------------------------------------

class TableInput(NamedTuple):
    """A DataFrame to record as a dataset input (``digest`` None: MLflow computes it)."""

    table: Any
    source: str
    name: str
    digest: str | None = None
    tags: dict[str, str] | None = None


def _dataset_input(item: TableInput, context: str):
    """-> (MLflow's DatasetInput of ``item``, its digest)."""
    with warnings.catch_warnings():  # MLflow registers its local source class twice and
        warnings.filterwarnings(     # warns that a plain path is ambiguous between them
            "ignore", message="The specified dataset source can be interpreted")
        dataset = mlflow.data.from_pandas(item.table, source=item.source, name=item.name,
                                          digest=item.digest)
    tags = [InputTag(DATASET_CONTEXT_TAG, context)]
    tags += [InputTag(k, v) for k, v in (item.tags or {}).items()]
    return DatasetInput(dataset._to_mlflow_entity(), tags=tags), dataset.digest


def log_table_inputs(client: MlflowClient, run_id: str, tables: list[TableInput],
                     context: str, model_id: str | None = None) -> None:
    """The tables as dataset inputs of ``run_id`` in one call, beside their model ``model_id``."""
    client.log_inputs(run_id, datasets=[_dataset_input(t, context)[0] for t in tables],
                      models=[LoggedModelInput(model_id)] if model_id else None)


SAMPLE_ROWS = 10_000  # MLflow's pandas digest reads the first 10,000 rows (and the count)


def pandas_digest(head, rows: int) -> str:
    """MLflow's pandas digest of a table from its first SAMPLE_ROWS rows and its row count,
    so a large file need not be read whole (equal for a cleaned file, which has no nulls)."""
    trimmed = head.head(SAMPLE_ROWS)
    strings = trimmed.columns[trimmed.map(lambda v: isinstance(v, str)).all(axis=0)]
    numbers = trimmed.select_dtypes(include=[np.number]).columns
    trimmed = trimmed[strings.union(numbers)]
    return get_normalized_md5_digest([pd.util.hash_pandas_object(trimmed).values,
                                      np.int64(rows)] + [str(x).encode() for x in head.columns])


def log_datasets(client: MlflowClient, run_ids: list[str], files: dict[str, Path],
                 context: str) -> dict[str, str]:
    """Record each cleaned JSONL file as a dataset input of every run in ``run_ids`` ->
    digests; only SAMPLE_ROWS rows are read, yet digest and profile are the whole file's."""
    inputs, digests = [], {}
    for name, path in files.items():
        with open(path, "rb") as fh:  # counted in 4 MiB blocks, not parsed
            rows = sum(block.count(b"\n") for block in iter(lambda: fh.read(1 << 22), b""))
        big = rows > SAMPLE_ROWS
        head = pd.read_json(path, lines=True, dtype=False, nrows=SAMPLE_ROWS if big else None)
        digest = pandas_digest(head, rows) if big else None  # None: MLflow's
        item, digests[name] = _dataset_input(TableInput(head, str(path), name, digest), context)
        if big:  # the profile of the whole file, not of the rows read
            d = item.dataset
            profile = json.dumps({"num_rows": rows, "num_elements": rows * len(head.columns)})
            item = DatasetInput(Dataset(d.name, d.digest, d.source_type, d.source, d.schema,
                                        profile), tags=item.tags)
        inputs.append(item)
    # retried: two runs logging the same new dataset at once can hit the server's unique key;
    # the retry then finds the row
    for run_id in run_ids:
        retry_unique_key(lambda run_id=run_id: client.log_inputs(run_id, datasets=inputs))
    return digests

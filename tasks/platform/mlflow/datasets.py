"""Data files as MLflow dataset inputs of runs ("Datasets" panel), tagged with their context."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import mlflow.data
import numpy as np
import pandas as pd
from mlflow.data.digest_utils import get_normalized_md5_digest
from mlflow.entities import Dataset, DatasetInput, InputTag, LoggedModelInput
from mlflow.tracking import MlflowClient

from tasks.platform.mlflow.runs import retry_unique_key
from tasks.platform.mlflow.tags import DATASET_CONTEXT_TAG


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

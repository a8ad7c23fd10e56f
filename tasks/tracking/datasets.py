"""Data files as MLflow dataset inputs of runs (the run's "Datasets" panel): name, source,
schema and digest, with the context they served in (training, evaluation, a collection, a
retrain batch)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, NamedTuple

from mlflow.tracking import MlflowClient

from tasks.tracking.runs import retry_unique_key
from tasks.tracking.tags import DATASET_CONTEXT_TAG


class TableInput(NamedTuple):
    """A data table to record as an MLflow dataset input: ``table`` a pandas DataFrame,
    ``source`` the file it was read from, ``digest`` MLflow's own when None, ``tags`` input
    tags beside the dataset's context."""

    table: Any
    source: str
    name: str
    digest: str | None = None
    tags: dict[str, str] | None = None


def _dataset_input(item: TableInput, context: str):
    """-> (MLflow's DatasetInput of ``item`` with its context and tags, its digest)."""
    import mlflow.data
    from mlflow.entities import DatasetInput, InputTag

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
    """Record the tables as dataset inputs of ``run_id`` in one call (name, source, schema,
    digest; the run's "Datasets" panel), with the logged model ``model_id`` as an input
    beside them when given (the model the data came from)."""
    from mlflow.entities import LoggedModelInput

    client.log_inputs(run_id, datasets=[_dataset_input(t, context)[0] for t in tables],
                      models=[LoggedModelInput(model_id)] if model_id else None)


def log_datasets(client: MlflowClient, run_ids: list[str], files: dict[str, Path],
                 context: str) -> dict[str, str]:
    """Record each (cleaned) data file as an MLflow dataset input of every run in ``run_ids``
    (name, source path, schema, digest; shown in the run's "Datasets" panel) -> digests."""
    import pandas as pd

    inputs, digests = [], {}
    for name, path in files.items():
        table = pd.read_json(path, lines=True, dtype=False)
        dataset_input, digests[name] = _dataset_input(TableInput(table, str(path), name),
                                                      context)
        inputs.append(dataset_input)
    for run_id in run_ids:
        _log_inputs(client, run_id, inputs)
    return digests


def _log_inputs(client: MlflowClient, run_id: str, inputs: list) -> None:
    """MLflow's server inserts a dataset it has not seen (experiment, name, digest) after
    looking it up: two runs logging the same data at once can hit its unique key (seen on
    PostgreSQL). The write is rolled back whole, so it is retried and then finds the row."""
    retry_unique_key(lambda: client.log_inputs(run_id, datasets=inputs))

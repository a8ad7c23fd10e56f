"""`rlhf runs`' page of pipeline runs read with SQL from a local SQLite store
(tasks/platform/mlflow/queries.py), against MLflow's own search_runs on the same store as the naive
reference: the same runs, order, names, latest metrics and "a later page" on every page."""

import math

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from tasks.platform.mlflow.queries import (
    PipelineRuns,
    _pipeline_runs_client,
    _pipeline_runs_sql,
    pipeline_runs,
    sqlite_file,
)
from tasks.platform.mlflow.tags import CONFIG_HASH_TAG, PARENT_TAG, STAGE_TAG


def reference(client: MlflowClient, experiment: str, limit: int, page: int) -> PipelineRuns:
    """The page as MLflow's search_runs gives it, following its page tokens (the client path
    of pipeline_runs, which any store but a plain SQLite file takes)."""
    return _pipeline_runs_client(client, experiment, limit, page)


def comparable(page: PipelineRuns) -> tuple:
    """NaN equals NaN here (a NaN metric must come back as NaN)."""
    return (page.experiment_id, page.more, [
        (r.run_id, r.run_name, r.status, r.start_time,
         sorted((k, "nan" if math.isnan(v) else v) for k, v in r.metrics.items()))
        for r in page.runs])


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Pipeline runs with tied start times, a deleted one, a failed one, one whose config
    hash tag is empty, stage runs and another experiment's runs (neither listed), metrics
    logged at several steps and a NaN."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"
    client = MlflowClient(uri)
    exp, other = client.create_experiment("rlhf-demo"), client.create_experiment("other")
    for n in range(9):
        run = client.create_run(exp, start_time=1_000 * (n // 2), run_name=f"round-{n}",
                                tags={CONFIG_HASH_TAG: f"h{n}"})
        rid = run.info.run_id
        client.log_batch(rid, metrics=[Metric("eval/judge_win_rate", 0.1 * n + s, 0, s)
                                       for s in range(3)])
        if n == 3:
            client.log_metric(rid, "eval/kl_to_ref", float("nan"))
        client.set_terminated(rid, "FAILED" if n == 2 else "FINISHED")
        if n == 5:
            client.delete_run(rid)
        client.create_run(exp, start_time=1_000 * n + 1, run_name="sft",
                          tags={PARENT_TAG: rid, STAGE_TAG: "sft"})
    client.create_run(exp, start_time=50_000, run_name="no-hash", tags={CONFIG_HASH_TAG: ""})
    client.create_run(other, start_time=60_000, run_name="elsewhere",
                      tags={CONFIG_HASH_TAG: "x"})
    return uri, client


@pytest.mark.parametrize("limit", [1, 2, 3, 8, 20])
def test_every_page_is_the_page_mlflow_search_runs_gives(store, limit):
    uri, client = store
    for page in range(1, 10 // limit + 3):  # up to a page past the last
        want = reference(client, "rlhf-demo", limit, page)
        got = _pipeline_runs_sql(sqlite_file(uri), "rlhf-demo", limit, page)
        assert got is not None, "read through MLflow, not with SQL"
        assert comparable(got) == comparable(want), (limit, page)
        assert comparable(pipeline_runs(uri, "rlhf-demo", limit, page)) == comparable(want)


def test_the_listing_holds_the_pipeline_runs_only(store):
    uri, _ = store
    names = [r.run_name for r in pipeline_runs(uri, "rlhf-demo", 20).runs]
    assert sorted(names) == [f"round-{n}" for n in range(9) if n != 5]


def test_a_store_not_in_mlflows_layout_is_read_through_mlflow(tmp_path):
    import sqlite3

    path = tmp_path / "other.db"
    sqlite3.connect(path).close()  # a SQLite file without MLflow's tables
    assert _pipeline_runs_sql(path, "rlhf-demo", 5, 1) is None
    assert sqlite_file(f"sqlite:///{path}?timeout=5") is None  # options: MLflow reads it
    assert sqlite_file("http://127.0.0.1:5000") is None

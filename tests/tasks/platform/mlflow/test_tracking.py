"""The step logger: no (key, step) logged twice on a resumed run, and only the histories of
the keys it logs are read (a parent run's system metrics are never fetched)."""

import pytest
from mlflow.tracking import MlflowClient

from tasks.platform.mlflow.runs import StepLogger, log_metrics


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (a new store costs its schema migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('tracking')}/m.db"


class CountingClient(MlflowClient):
    def __init__(self, uri):
        super().__init__(uri)
        self.histories: list[str] = []

    def get_metric_history(self, run_id, key):
        self.histories.append(key)
        return super().get_metric_history(run_id, key)


def test_resumed_logger_skips_logged_steps_without_reading_histories(store_uri):
    client = CountingClient(store_uri)
    run_id = client.create_run(client.create_experiment("x")).info.run_id
    for step in range(3):
        log_metrics(client, run_id, {f"system/m{i}": float(i) for i in range(30)}, step)
    log_metrics(client, run_id, {"eval/a": 1.0}, 0)
    log_metrics(client, run_id, {"eval/a": 2.0}, 4)
    log_metrics(client, run_id, {"eval/a": 0.5}, 2)  # logged out of order: the last is step 4
    log = StepLogger(client, run_id)  # as a stage resumed on this run builds it
    log(0, {"eval/a": 9.0, "eval/b": 2.0})
    log(4, {"eval/a": 9.0})
    log(5, {"eval/a": 3.0})
    assert client.histories == []  # resume reads the latest step of each key from the run
    assert sorted((m.step, m.value) for m in client.get_metric_history(run_id, "eval/a")) == \
        [(0, 1.0), (2, 0.5), (4, 2.0), (5, 3.0)]
    assert [m.step for m in client.get_metric_history(run_id, "eval/b")] == [0]


class RacingClient(MlflowClient):
    """A server that loses the dataset insert race ``losses`` times, then answers."""

    def __init__(self, uri, losses, message):
        super().__init__(uri)
        self.losses, self.message, self.calls = losses, message, 0

    def log_inputs(self, run_id, datasets=None, models=None):
        self.calls += 1
        if self.calls <= self.losses:
            from mlflow.exceptions import MlflowException

            raise MlflowException(self.message)
        return super().log_inputs(run_id, datasets=datasets, models=models)


def test_a_dataset_insert_lost_to_a_concurrent_run_is_retried(store_uri, tmp_path):
    from mlflow.exceptions import MlflowException

    from tasks.platform.mlflow.artifacts import log_datasets

    data = tmp_path / "sft.jsonl"
    data.write_text('{"prompt": "a", "response": "b"}\n')
    race = "duplicate key value violates unique constraint \"dataset_pk\""
    client = RacingClient(store_uri, losses=1, message=race)
    run_id = client.create_run(client.create_experiment("datasets")).info.run_id
    digests = log_datasets(client, [run_id], {"sft": data}, "training")
    assert client.calls == 2
    (logged,) = client.get_run(run_id).inputs.dataset_inputs
    assert logged.dataset.name == "sft" and logged.dataset.digest == digests["sft"]
    other = RacingClient(store_uri, losses=1, message="disk full")
    with pytest.raises(MlflowException, match="disk full"):  # any other error is not retried
        log_datasets(other, [run_id], {"sft": data}, "training")
    assert other.calls == 1


def test_the_tags_module_names_each_tag_once_and_mlflow_s_own_as_mlflow_does():
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT, MLFLOW_PARENT_RUN_ID

    from tasks.platform.mlflow import tags

    names = {k: v for k, v in vars(tags).items() if k.endswith(("_TAG", "_PREFIX"))}
    assert len(set(names.values())) == len(names)  # no tag under two names
    assert all(v.startswith(("rlhf.", "mlflow.")) for v in names.values())
    assert all(v.endswith(".") == k.endswith("_PREFIX") for k, v in names.items())
    assert (tags.PARENT_TAG, tags.DATASET_CONTEXT_TAG) == (MLFLOW_PARENT_RUN_ID,
                                                           MLFLOW_DATASET_CONTEXT)


def test_a_store_that_cannot_mark_the_run_ended_is_logged_not_raised(caplog):
    """While a stage's error propagates, a store refusing the terminal status is named in the
    log (the run stays RUNNING for --resume) and the stage's own error is the one raised."""
    import logging

    from tasks.platform.mlflow.runs import mark_ended

    class Refusing:
        def set_terminated(self, run_id, status):
            raise ConnectionError("store gone")

    caplog.set_level(logging.WARNING, logger="rlhf.tracking")
    try:
        try:
            raise ValueError("the stage's own error")
        except ValueError:
            mark_ended(Refusing(), "run123")
            raise
    except ValueError as err:
        assert str(err) == "the stage's own error"
    (record,) = [r for r in caplog.records if r.name == "rlhf.tracking"]
    assert "run123 FAILED" in record.getMessage() and "store gone" in record.getMessage()


def test_a_large_data_file_is_logged_from_its_head_with_mlflow_s_digest_and_count(
        store_uri, tmp_path, monkeypatch):
    """Only the first rows are read (the count from the lines), yet the digest and profile
    are those MLflow gives the whole table."""
    import json as json_module

    import mlflow.data.digest_utils as digest_utils
    import pandas as pd
    from mlflow.tracking import MlflowClient

    from tasks.platform.mlflow import artifacts

    monkeypatch.setattr(artifacts, "SAMPLE_ROWS", 5)
    monkeypatch.setattr(digest_utils, "MAX_ROWS", 5)
    rows = [{"prompt": f"p{i}", "chosen": "c", "rejected": f"r{i % 3}", "margin": i / 2}
            for i in range(12)]
    data = tmp_path / "preference.jsonl"
    data.write_text("".join(json_module.dumps(r) + "\n" for r in rows))
    reads = []
    real = pd.read_json
    monkeypatch.setattr(pd, "read_json", lambda *a, **k: reads.append(k.get("nrows")) or
                        real(*a, **k))
    client = MlflowClient(store_uri)
    run_id = client.create_run(client.create_experiment("big")).info.run_id
    digests = artifacts.log_datasets(client, [run_id], {"preference": data}, "training")
    assert reads == [5]
    whole = real(data, lines=True, dtype=False)
    assert digests["preference"] == digest_utils.compute_pandas_digest(whole)
    (logged,) = client.get_run(run_id).inputs.dataset_inputs
    assert json_module.loads(logged.dataset.profile)["num_rows"] == 12
    assert logged.dataset.digest == digests["preference"]

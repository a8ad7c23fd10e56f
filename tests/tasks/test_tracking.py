"""The step logger: no (key, step) logged twice on a resumed run, and only the histories of
the keys it logs are read (a parent run's system metrics are never fetched)."""

from mlflow.tracking import MlflowClient

from tasks.tracking import StepLogger, log_metrics


class CountingClient(MlflowClient):
    def __init__(self, uri):
        super().__init__(uri)
        self.histories: list[str] = []

    def get_metric_history(self, run_id, key):
        self.histories.append(key)
        return super().get_metric_history(run_id, key)


def test_resumed_logger_skips_logged_steps_without_reading_histories(tmp_path):
    client = CountingClient(f"sqlite:///{tmp_path}/m.db")
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

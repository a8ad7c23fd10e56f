"""The parent run's experiment keeps artifacts beside a local SQLite store."""

from mlflow.tracking import MlflowClient

from tasks.prepare import _experiment_id, artifact_location


def test_sqlite_artifacts_live_beside_the_database_not_in_the_working_folder(
        tmp_path, monkeypatch):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()
    client = MlflowClient(uri)
    exp_id = _experiment_id(client, "rlhf-x", uri)
    assert _experiment_id(client, "rlhf-x", uri) == exp_id  # found, not created twice
    run_id = client.create_run(exp_id).info.run_id
    client.log_text(run_id, "hi", "notes/a.txt")
    assert list((tmp_path / "store" / "mlruns").rglob("notes/a.txt"))
    assert not list(elsewhere.rglob("*"))


def test_servers_and_other_stores_keep_their_own_artifact_root():
    assert artifact_location("http://127.0.0.1:5000") is None
    assert artifact_location("sqlite:///mlflow.db").endswith("/mlruns")

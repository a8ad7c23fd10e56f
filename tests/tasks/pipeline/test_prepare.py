"""The parent run's experiment keeps artifacts beside a local SQLite store."""

from mlflow.tracking import MlflowClient

from tasks.platform.mlflow.runs import artifact_location, ensure_experiment


def test_sqlite_artifacts_live_beside_the_database_not_in_the_working_folder(
        tmp_path, monkeypatch):
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    uri = f"sqlite:///{tmp_path}/store/mlflow.db"
    (tmp_path / "store").mkdir()
    client = MlflowClient(uri)
    exp_id = ensure_experiment(client, "rlhf-x", uri)
    assert ensure_experiment(client, "rlhf-x", uri) == exp_id  # found, not created twice
    run_id = client.create_run(exp_id).info.run_id
    client.log_text(run_id, "hi", "notes/a.txt")
    assert list((tmp_path / "store" / "mlruns").rglob("notes/a.txt"))
    assert not list(elsewhere.rglob("*"))


def test_experiment_created_by_a_concurrent_run_is_used_not_an_error(tmp_path):
    """Two pipeline runs on one server: the other run creates the experiment between this
    run's lookup and its create."""
    uri = f"sqlite:///{tmp_path}/m.db"
    other = MlflowClient(uri)

    class LateClient(MlflowClient):
        looked_up = False

        def get_experiment_by_name(self, name):
            if not self.looked_up:  # lookup misses; then the other run creates it
                self.looked_up = True
                other.create_experiment(name)
                return None
            return super().get_experiment_by_name(name)

    exp_id = ensure_experiment(LateClient(uri), "rlhf-race", uri)
    assert exp_id == other.get_experiment_by_name("rlhf-race").experiment_id


def test_servers_and_other_stores_keep_their_own_artifact_root():
    assert artifact_location("http://127.0.0.1:5000") is None
    assert artifact_location("sqlite:///mlflow.db").endswith("/mlruns")


def _cfg(tmp_path, *overrides):
    from tasks.config.pipeline_config import load_config
    from tests.shared import TEST_CONFIG as CONFIG

    return load_config(CONFIG, [f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db",
                                f"tracking.workdir={tmp_path}/runs", *overrides])


def test_same_prefect_flow_run_reopens_its_parent_run(tmp_path, monkeypatch):
    """`prefect flow-run retry` keeps the flow-run id: the retry continues the same MLflow run;
    another flow run with the same config (and no run name) starts a new one."""
    import tasks.pipeline.prepare as prepare

    monkeypatch.setattr(prepare, "_prefect_flow_run_id", lambda: "flow-run-1")
    first = prepare.open_parent_run(_cfg(tmp_path), None)
    again = prepare.open_parent_run(_cfg(tmp_path), None)
    assert again.parent_run_id == first.parent_run_id and again.workdir == first.workdir
    monkeypatch.setattr(prepare, "_prefect_flow_run_id", lambda: "flow-run-2")
    assert prepare.open_parent_run(_cfg(tmp_path), None).parent_run_id != first.parent_run_id


def test_resume_with_changed_settings_records_the_new_config(tmp_path, monkeypatch):
    import tasks.pipeline.prepare as prepare

    monkeypatch.setattr(prepare, "_prefect_flow_run_id", lambda: None)
    first = prepare.open_parent_run(_cfg(tmp_path), None)
    changed = _cfg(tmp_path, "sft.optim.lr=0.0001")
    resumed = prepare.open_parent_run(changed, first.parent_run_id)
    assert resumed.parent_run_id == first.parent_run_id
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    run = client.get_run(first.parent_run_id)
    assert run.data.tags["rlhf.resumed_config_hash"] == changed.config_hash()
    files = {a.path for a in client.list_artifacts(first.parent_run_id, "config")}
    assert f"config/resumed_config_{changed.config_hash()}.json" in files


def test_the_parent_run_and_every_stage_run_record_the_hardware(tmp_path, monkeypatch,
                                                                threads_kept):
    """rlhf.hw.* on the parent and each child run, threads as model.torch_threads set them
    before the stage body runs; a resume on another machine writes that machine's."""
    import torch

    import tasks.pipeline.prepare as prepare
    from rlhf_core.hardware import hardware_facts
    from tasks.pipeline.stages.context import Stage
    from tasks.pipeline.stages.records import StageRecord
    from tasks.pipeline.stages.run import run_stage

    monkeypatch.setattr(prepare, "_prefect_flow_run_id", lambda: None)
    torch.set_num_threads(3)
    ctx = prepare.open_parent_run(_cfg(tmp_path, "model.torch_threads=1", "model.device=cpu"),
                                  None)
    assert ctx.device == "cpu"
    seen = {}

    def body(sc) -> StageRecord:
        seen["threads"] = torch.get_num_threads()  # what the stage's kernels use
        return StageRecord()

    cfg = _cfg(tmp_path, "model.torch_threads=1", "model.device=cpu")
    out = run_stage(ctx, cfg, Stage("sft", body, StageRecord))
    client = MlflowClient(ctx.tracking_uri)
    facts = hardware_facts("cpu")
    for run_id in (ctx.parent_run_id, out.run_id):
        tags = client.get_run(run_id).data.tags
        assert {k: tags[f"rlhf.hw.{k}"] for k in facts} == {**facts, "threads": "1"}
    assert seen["threads"] == 1
    # the compute precision auto chose, with why (the demo's tiny model: fp32 on any CPU)
    assert client.get_run(ctx.parent_run_id).data.tags["rlhf.precision"].startswith("fp32 (")

    monkeypatch.setattr("tasks.platform.mlflow.runs.hardware_facts",
                        lambda device=None: {**facts, "cpu": "Other CPU", "gpu": "none"})
    prepare.open_parent_run(_cfg(tmp_path, "model.torch_threads=1"), ctx.parent_run_id)
    assert client.get_run(ctx.parent_run_id).data.tags["rlhf.hw.cpu"] == "Other CPU"

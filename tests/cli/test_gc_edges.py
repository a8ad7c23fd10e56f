"""`rlhf gc` at its edges: two gcs of one store at once (the second waits, both summarise,
no traceback); a purged pipeline run takes its stage runs and its empty artifact folders with
it; a run deleted in the MLflow UI is purged only after tracking.gc_deleted_age_days, listed
with its size meanwhile; what a killed gate or stage left in a run folder (``*.part`` files,
a checkpoint save's temporary folder) goes once no live process owns the folder."""

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.entities import ViewType
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tests.shared import ROOT, TEST_CONFIG, rlhf_in_process

STAGES = ("validate", "sft", "reward_model")


def deleted_days_ago(db: Path, run_id: str, days: float) -> None:
    """Date a run's deletion back (the store records when the UI's Delete was pressed)."""
    with sqlite3.connect(db) as con:
        con.execute("UPDATE runs SET deleted_time = ? WHERE run_uuid = ?",
                    (int((time.time() - days * 86400) * 1000), run_id))


def pipeline_run(client: MlflowClient, exp: str, workdir: Path, status="FINISHED") -> str:
    """A parent run with three stage runs, each with an artifact, and its run folder."""
    parent = client.create_run(exp, tags={"rlhf.config_hash": "abc"}).info.run_id
    client.log_text(parent, "p" * 3000, "config/resolved_config.json")
    for stage in STAGES:
        child = client.create_run(exp, run_name=stage, tags={
            "mlflow.parentRunId": parent, "rlhf.stage": stage}).info.run_id
        client.log_text(child, "s" * 20_000, f"{stage}/model.txt")
        client.set_terminated(child, "FINISHED")
    client.set_terminated(parent, status)
    (workdir / parent / "sft").mkdir(parents=True)
    return parent


@pytest.fixture
def store(tmp_path):
    """(client, experiment id, gc arguments) of a store in tmp_path."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("rlhf-test", artifact_location=(tmp_path / "mlruns").as_uri())
    args = ["gc", "--config", str(TEST_CONFIG), "--keep-runs", "9"] + [
        a for s in (f"tracking.tracking_uri={uri}", f"tracking.workdir={tmp_path}/runs",
                    f"retrain.watch_dir={tmp_path}/batches",
                    f"collect.out_dir={tmp_path}/to_label") for a in ("--set", s)]
    return client, exp, args


def _gone(client: MlflowClient, run_id: str) -> bool:
    try:
        client.get_run(run_id)
    except MlflowException:
        return True
    return False


def test_a_purged_pipeline_run_leaves_no_stage_run_and_no_empty_folder(store, tmp_path, capfd):
    client, exp, args = store
    kept = pipeline_run(client, exp, tmp_path / "runs")
    purged = pipeline_run(client, exp, tmp_path / "runs")
    under = [r.info.run_id for r in client.search_runs(
        [exp], f"tags.`mlflow.parentRunId` = '{purged}'")]
    client.delete_run(purged)  # as the UI's Delete does: the stage runs stay active
    deleted_days_ago(tmp_path / "mlflow.db", purged, 10)
    assert all(client.get_run(r).info.lifecycle_stage == "active" for r in under)

    out = rlhf_in_process([*args, "--yes"], capfd)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"gc: deleted mlflow run {purged} (63.0 kB): marked deleted 10.0 days ago, with " \
        "the 3 run(s) under it: removed with the artifacts by `mlflow gc`" in out.stdout
    assert all(_gone(client, r) for r in [purged, *under])
    assert client.search_runs([exp], f"tags.`mlflow.parentRunId` = '{purged}'",
                              run_view_type=ViewType.ALL) == []
    left = {p.name for p in (tmp_path / "mlruns").iterdir()}
    assert not left & {purged, *under}  # no empty folder of theirs
    assert kept in left and not (tmp_path / "runs" / purged).exists()
    assert "nothing to delete" in rlhf_in_process([*args, "--yes"], capfd).stdout


def test_a_run_deleted_in_the_ui_is_purged_only_after_the_grace_period(store, tmp_path, capfd):
    client, exp, args = store
    recent, old = (pipeline_run(client, exp, tmp_path / "runs") for _ in range(2))
    for run_id, days in ((recent, 2), (old, 9)):
        client.delete_run(run_id)
        deleted_days_ago(tmp_path / "mlflow.db", run_id, days)

    dry = rlhf_in_process(args, capfd).stdout
    assert f"keep   mlflow run {recent} (63.0 kB): marked deleted 2.0 days ago, with the 3 " \
        "run(s) under it: purged 7 days after its deletion (tracking.gc_deleted_age_days); " \
        "until then the MLflow UI can restore it" in dry
    assert f"delete mlflow run {old} (63.0 kB): marked deleted 9.0 days ago" in dry
    out = rlhf_in_process([*args, "--yes"], capfd)
    assert out.returncode == 0 and _gone(client, old) and not _gone(client, recent)
    client.restore_run(recent)  # still restorable, with its artifacts
    assert [a.path for a in client.list_artifacts(recent, "config")] == \
        ["config/resolved_config.json"]

    client.delete_run(recent)
    deleted_days_ago(tmp_path / "mlflow.db", recent, 2)
    sooner = rlhf_in_process([*args, "--yes", "--set", "tracking.gc_deleted_age_days=1"], capfd)
    assert sooner.returncode == 0 and _gone(client, recent)


def test_two_gcs_of_one_store_at_once_both_end_with_their_summaries(store, tmp_path):
    client, exp, args = store
    doomed = [pipeline_run(client, exp, tmp_path / "runs") for _ in range(2)]
    for run_id in doomed:
        client.delete_run(run_id)
        deleted_days_ago(tmp_path / "mlflow.db", run_id, 30)
    pause = tmp_path / "paused"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def gc(**extra) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "cli", *args, "--yes"], cwd=ROOT,
                                text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env={**env, **extra})

    first = gc(RLHF_PAUSE_AT="gc:delete", RLHF_PAUSE_FILE=str(pause))
    deadline = time.monotonic() + 300
    while not pause.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert pause.exists(), first.communicate()[1][-3000:]  # it holds the lock, has planned
    second = gc()
    time.sleep(15)  # long enough for it to start and find the lock taken
    assert second.poll() is None  # waiting, not failed
    pause.unlink()
    (out1, err1), (out2, err2) = first.communicate(timeout=300), second.communicate(timeout=300)
    assert first.returncode == second.returncode == 0, err1[-2000:] + err2[-2000:]
    assert "Traceback" not in err1 + err2
    assert "deleted 4 item(s)" in out1  # two run folders, two pipeline runs
    assert "another gc of sqlite:///" in out2 and "waiting for it to finish" in out2
    assert "nothing to delete" in out2 and "deleted 0 item(s)" in out2
    assert all(_gone(client, r) for r in doomed)


def _leftovers(folder: Path) -> list[Path]:
    (folder / "validate" / ".chunks").mkdir(parents=True)
    made = [folder / "validate" / "preference.jsonl.part",
            folder / "validate" / "preference.tokens.arrow.part",
            folder / "validate" / ".chunks" / f".{'a' * 64}.arrow.1a2b3c4d.part"]
    for path in made:
        path.write_bytes(b"x" * 50_000)
    tmp = folder / "sft" / "checkpoints" / ".step_00000004.tmp"
    tmp.mkdir(parents=True)
    (tmp / "model.safetensors").write_bytes(b"w" * 50_000)
    return [*made[:2], made[2], tmp]


def test_what_a_killed_stage_left_goes_once_no_live_process_owns_its_folder(
        store, tmp_path, capfd):
    client, exp, args = store
    run_id = pipeline_run(client, exp, tmp_path / "runs", status="KILLED")
    folder = tmp_path / "runs" / run_id
    left = _leftovers(folder)
    owner = subprocess.Popen(  # a live process of the run: a stage runs in the folder
        [sys.executable, "-c", "import sys, time; from tasks.pipeline.retention import owning\n"
         f"with owning({str(folder)!r}):\n print('held', flush=True); time.sleep(600)"],
        cwd=ROOT, text=True, stdout=subprocess.PIPE)
    assert owner.stdout.readline().strip() == "held"
    try:
        out = rlhf_in_process([*args, "--yes"], capfd).stdout
        assert "a live process owns the run folder" in out and all(p.exists() for p in left)
    finally:
        owner.send_signal(signal.SIGKILL)  # killed mid-stage: the kernel drops its lock
        owner.wait()
    out = rlhf_in_process([*args, "--yes"], capfd)
    assert out.returncode == 0, out.stderr[-3000:]
    for path in left:
        assert not path.exists() and f"gc: deleted leftover {path}" in out.stdout
    assert (folder / "sft").is_dir() and (folder / "validate" / ".chunks").is_dir()
    assert f"keep   run folder {folder}: KILLED" in out.stdout  # resumable: kept


def test_a_stage_killed_in_a_checkpoint_save_leaves_a_folder_gc_sweeps(
        prefect_api, store, tmp_path, capfd, threads_kept):
    """A real kill: SIGKILL inside SFT's checkpoint save (files written, not renamed in);
    gc removes the temporary folder, keeps the run (resumable) and its last checkpoint."""
    client, exp, args = store
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = subprocess.run(
        [sys.executable, "-m", "cli", "run", "--config", str(TEST_CONFIG), "--set",
         f"tracking.workdir={tmp_path}/runs", "--set", "sft.checkpoint_every=1"],
        cwd=ROOT, text=True, capture_output=True, timeout=900,
        env={**os.environ, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": uri,
             "RLHF_CRASH_AT": "checkpoint:sft:2"})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    (tmp,) = (tmp_path / "runs").glob("*/sft/checkpoints/.step_00000002.tmp")
    run_folder = tmp.parents[2]
    out = rlhf_in_process([*args, "--yes"], capfd)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"gc: deleted leftover {tmp}" in out.stdout and not tmp.exists()
    assert (run_folder / "sft" / "checkpoints" / "step_00000001").is_dir()
    assert f"keep   run folder {run_folder}: RUNNING" in out.stdout

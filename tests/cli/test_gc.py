"""`rlhf gc` on a store laid out as the loop leaves it (runs, aliases, batches, a pull record;
no training): a dry run deletes nothing; --yes deletes the older finished runs' folders, the
runs marked deleted (MLflow's gc, artifacts too), old consumed and quarantined batches and a
fully pulled collection's record, never an alias's runs, a resumable run or an unconsumed
batch; a second gc finds nothing; a gc killed midway leaves nothing a later command trips
over, and the next gc finishes it."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from tasks.config.pipeline_config import load_config
from tasks.gc.plan import apply_gc, plan_gc
from tasks.platform.mlflow.tags import (
    COLLECTION_LABEL_STUDIO_TAG,
    COLLECTION_TAG,
    CONSUMED_TAG,
    PIPELINE_RUN_TAG,
    PULLED_ALL_TAG,
)
from tasks.retrain.batches import file_digest, find_batches
from tasks.retrain.labels.pull import pull_collection
from tasks.retrain.store import CONSUMED_COPY, LINK
from tests.shared import ROOT, TEST_CONFIG, rlhf_in_process

OLD = time.time() - 40 * 86400  # older than retrain.gc_batch_age_days (30)


def _run(client, exp, root: Path, name: str, status: str, ended: int, **tags) -> str:
    run_id = client.create_run(exp, run_name=name, tags=tags).info.run_id
    client.set_terminated(run_id, status=status, end_time=ended)
    folder = root / "runs" / run_id / "ppo" / "policy"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * 1000)
    return run_id


def _version(client, name: str, parent: str, alias: str) -> None:
    register = client.create_run(client.get_run(parent).info.experiment_id,
                                 tags={"mlflow.parentRunId": parent}).info.run_id
    if not client.search_registered_models(f"name = '{name}'"):
        client.create_registered_model(name)
    version = client.create_model_version(name, f"runs:/{register}/model", run_id=register,
                                          tags={PIPELINE_RUN_TAG: parent})
    client.set_registered_model_alias(name, alias, version.version)


def deleted_days_ago(db: Path, run_id: str, days: float) -> None:
    """Date a run's deletion back (the store records when the UI's Delete was pressed)."""
    with sqlite3.connect(db) as con:
        con.execute("UPDATE runs SET deleted_time = ? WHERE run_uuid = ?",
                    (int((time.time() - days * 86400) * 1000), run_id))


@pytest.fixture
def loop(tmp_path):
    """The store and folders -> (config, client, run ids by role, paths by role)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config(TEST_CONFIG, [f"tracking.tracking_uri={uri}",
                                    f"tracking.workdir={tmp_path}/runs",
                                    f"retrain.watch_dir={tmp_path}/batches",
                                    f"collect.out_dir={tmp_path}/to_label"])
    client = MlflowClient(uri)
    exp = client.create_experiment("rlhf-test", artifact_location=(tmp_path / "mlruns").as_uri())
    hour = 3_600_000
    now = int(time.time() * 1000)
    ids = {role: _run(client, exp, tmp_path, role, status, now - age * hour)
           for role, status, age in (("champion", "FINISHED", 50), ("old", "FINISHED", 40),
                                     ("older", "FINISHED", 45), ("newest", "FINISHED", 1),
                                     ("failed", "FAILED", 60), ("stopped", "KILLED", 61),
                                     ("deleted", "FINISHED", 70), ("prev", "FINISHED", 80))}
    _version(client, "rlhf-policy", ids["champion"], "champion")
    _version(client, "rlhf-policy", ids["prev"], "previous-champion")
    client.log_text(ids["deleted"], "x" * 500, "checkpoint/model.txt")
    for role in ("deleted", "prev"):  # the user deleted both, 10 days ago; an alias needs prev
        client.delete_run(ids[role])
        deleted_days_ago(tmp_path / "mlflow.db", ids[role], 10)
    paths = _batches(client, exp, tmp_path)
    paths["pulls"] = _pull_record(client, exp, tmp_path)
    return cfg, client, ids, paths


def _batches(client, exp, tmp_path) -> dict[str, Path]:
    watch = tmp_path / "batches"
    (watch / "quarantine").mkdir(parents=True)
    paths = {name: watch / f"{name}.jsonl" for name in ("new", "used", "used_recent")}
    paths["quarantined"] = watch / "quarantine" / "bad.jsonl"
    paths["note"] = watch / "quarantine" / "bad.jsonl.why.txt"
    for name, path in paths.items():
        path.write_text(json.dumps({"prompt": name, "chosen": "a", "rejected": "b"}) + "\n")
        if name != "used_recent":
            os.utime(path, (OLD, OLD))
    retrain = client.create_run(exp, tags={CONSUMED_TAG: json.dumps(
        [file_digest(paths["used"]), file_digest(paths["used_recent"])])}).info.run_id
    for name in ("used", "used_recent"):
        client.log_artifact(retrain, str(paths[name]),
                            f"{CONSUMED_COPY}/{file_digest(paths[name])}")
    client.set_terminated(retrain, "FINISHED")
    return paths


def _pull_record(client, exp, tmp_path) -> Path:
    run = client.create_run(exp, tags={COLLECTION_TAG: "v1-abc",
                                       COLLECTION_LABEL_STUDIO_TAG: "http://ls/projects/1"})
    client.log_dict(run.info.run_id, {"url": "http://ls", "project_id": 1,
                                      "project_title": "t", "tasks": {"1": "p1", "2": "p2"},
                                      "shown": {}}, LINK)
    client.set_terminated(run.info.run_id, "FINISHED")
    done = tmp_path / "to_label" / "pulls" / "v1-abc" / "done"
    done.mkdir(parents=True)
    (done / "pull.jsonl").write_text("".join(json.dumps({"id": p, "choice": "a"}) + "\n"
                                             for p in ("p1", "p2")))
    return done.parent


def _files(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*"))


def _gc(cfg, capfd, *args):
    proc = rlhf_in_process(["gc", "--config", str(TEST_CONFIG), *[
        a for f in ("tracking_uri", "workdir") for a in
        ("--set", f"tracking.{f}={getattr(cfg.tracking, f)}")],
        "--set", f"retrain.watch_dir={cfg.retrain.watch_dir}",
        "--set", f"collect.out_dir={cfg.collect.out_dir}", *args], capfd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_dry_run_lists_what_would_go_and_deletes_nothing(loop, tmp_path, capfd):
    cfg, client, ids, paths = loop
    before = _files(tmp_path)
    out = _gc(cfg, capfd, "--keep-runs", "1")
    assert _files(tmp_path) == before
    assert client.get_run(ids["deleted"]).info.lifecycle_stage == "deleted"  # not collected
    assert "would delete 8 item(s)" in out and "nothing was deleted" in out
    for role in ("old", "older", "deleted"):
        assert f"delete run folder {tmp_path}/runs/{ids[role]}" in out, role
    assert f"delete mlflow run {ids['deleted']}" in out
    assert f"keep   run folder {tmp_path}/runs/{ids['prev']}" in out  # prev: an alias's


def test_gc_deletes_what_no_longer_serves_and_never_what_an_alias_or_a_resume_needs(
        loop, tmp_path, capfd):
    cfg, client, ids, paths = loop
    out = _gc(cfg, capfd, "--keep-runs", "1", "--yes")
    runs = tmp_path / "runs"
    assert sorted(p.name for p in runs.iterdir()) == sorted(
        ids[r] for r in ("champion", "newest", "failed", "stopped", "prev"))
    with pytest.raises(MlflowException):
        client.get_run(ids["deleted"])  # collected by MLflow's gc, with its artifacts
    assert not list((tmp_path / "mlruns").rglob("model.txt"))
    assert client.get_run(ids["prev"]).info.lifecycle_stage == "deleted"  # kept: an alias's
    assert str(client.get_model_version_by_alias("rlhf-policy", "champion").version) == "1"
    assert paths["new"].is_file() and paths["used_recent"].is_file()  # never unconsumed
    assert not paths["used"].exists()
    assert not paths["quarantined"].exists() and not paths["note"].exists()
    assert not paths["pulls"].exists()
    assert out.count("gc: deleted") == 8 and "deleted 8 item(s)" in out
    # the collection's run says it was pulled in full: a pull skips it, with no record
    run = client.search_runs([client.get_experiment_by_name("rlhf-test").experiment_id],
                             f"tags.`{COLLECTION_TAG}` = 'v1-abc'")[0]
    assert run.data.tags[PULLED_ALL_TAG] == "2"
    assert pull_collection(cfg, client, run).status == "done"

    assert "nothing to delete" in _gc(cfg, capfd, "--keep-runs", "1", "--yes")
    assert plan_gc(cfg, keep_runs=1).deletions == []


def test_a_gc_killed_midway_leaves_only_trash_and_the_next_one_finishes(loop, tmp_path,
                                                                          monkeypatch, capfd):
    cfg, client, ids, paths = loop
    plan = plan_gc(cfg, keep_runs=1)
    calls = []

    def killed(path, **kw):  # the process dies after the second rename
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(path, **kw)

    real = __import__("shutil").rmtree
    monkeypatch.setattr("tasks.pipeline.retention.shutil.rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        apply_gc(cfg, plan)
    monkeypatch.undo()
    runs = tmp_path / "runs"
    names = [p.name for p in runs.iterdir()]
    assert any(n.startswith(".trash-") for n in names)  # whole, under a name nothing reads
    assert all(n.startswith(".trash-") or (runs / n / "ppo" / "policy" / "model.safetensors")
               .is_file() for n in names)  # no half-deleted run folder under its own name
    out = _gc(cfg, capfd, "--keep-runs", "1", "--yes")
    assert "trash" in out and not list(runs.glob(".trash-*"))
    assert sorted(p.name for p in runs.iterdir()) == sorted(
        ids[r] for r in ("champion", "newest", "failed", "stopped", "prev"))
    assert plan_gc(cfg, keep_runs=1).deletions == []


@pytest.mark.parametrize("point", ["remove:gc:run_folder", "remove:gc:batch"])
def test_a_gc_process_killed_after_a_rename_leaves_nothing_the_loop_trips_over(
        loop, tmp_path, capfd, point):
    cfg, client, ids, paths = loop
    args = ["gc", "--config", str(TEST_CONFIG), "--keep-runs", "1", "--yes", *[
        a for s in (f"tracking.tracking_uri={cfg.tracking.tracking_uri}",
                    f"tracking.workdir={cfg.tracking.workdir}",
                    f"retrain.watch_dir={cfg.retrain.watch_dir}",
                    f"collect.out_dir={cfg.collect.out_dir}") for a in ("--set", s)]]
    digests = {file_digest(paths["used"]), file_digest(paths["used_recent"])}
    killed = subprocess.run([sys.executable, "-m", "cli", *args], cwd=ROOT, text=True,
                            capture_output=True, timeout=300,
                            env={**os.environ, "RLHF_CRASH_AT": point})
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert len(list(tmp_path.rglob(".trash-*"))) == 1  # the one renamed, whole
    runs = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".trash-")]
    assert all((p / "ppo" / "policy" / "model.safetensors").is_file() for p in runs)
    # what the retrain reads next: the trash is no batch; a consumed batch whose file went
    # is read from its run's copy
    found = find_batches.fn(cfg)
    assert [b.name for b in found.new] == ["new.jsonl"]
    assert {b.digest for b in found.consumed} == digests
    out = _gc(cfg, capfd, "--keep-runs", "1", "--yes")
    assert not list(tmp_path.rglob(".trash-*")) and "gc: deleted trash" in out
    assert plan_gc(cfg, keep_runs=1).deletions == []


def test_gc_removes_validations_and_chunks_the_cache_has_not_used_for_its_age(
        loop, tmp_path, capfd, monkeypatch):
    """The validation cache grows with every new data set and retrain round: what no gate
    read or wrote for tracking.gc_cache_age_days (30) goes; what a gate still reads stays
    (a read sets the age again: tests/data_checks), as does what gc does not know."""
    from data_checks.cache import CACHE_ENV, ValidationCache, chunk_folder

    cfg, *_ = loop
    cache = ValidationCache(tmp_path / "cache")
    monkeypatch.setenv(CACHE_ENV, str(cache.root))
    chunks = chunk_folder(cache)
    chunks.mkdir(parents=True)
    made = {}
    for name, hexdigit, age_days in (("old", "a", 40), ("recent", "b", 3)):
        entry = cache.entry(hexdigit * 64)
        (entry / "cleaned").mkdir(parents=True)
        (entry / "report.json").write_text("{}")
        chunk = chunks / f"{hexdigit * 63}1.arrow"
        chunk.write_bytes(b"x" * 2000)
        for path in (entry, chunk):
            os.utime(path, (time.time() - age_days * 86400,) * 2)
        made[name] = (entry, chunk)
    stopped = chunks / ".abc.arrow.1234.part"  # a put killed before its rename
    stopped.write_bytes(b"half")
    os.utime(stopped, (OLD, OLD))
    mine = cache.root / "notes.txt"  # not the cache's: never touched
    mine.write_text("mine")
    os.utime(mine, (OLD, OLD))
    plan = plan_gc(cfg, keep_runs=99)
    assert sorted(f.target for f in plan.deletions if str(cache.root) in f.target) == sorted(
        [str(p) for p in made["old"]] + [str(stopped)])
    out = _gc(cfg, capfd, "--keep-runs", "99", "--yes")
    assert f"gc: deleted cache {made['old'][1]} (2.0 kB): tokenized chunk unused for 30 " \
        "days (tracking.gc_cache_age_days)" in out
    assert f"keep   cache {cache.root}: 1 passed validations and 1 tokenized chunks used " \
        "within 30 days" in out
    assert not any(p.exists() for p in [*made["old"], stopped])
    assert all(p.exists() for p in [*made["recent"], mine])
    assert not [f for f in plan_gc(cfg, keep_runs=99).deletions if f.kind == "cache"]


def test_gc_refuses_a_negative_count_and_a_missing_store(tmp_path, capfd):
    with pytest.raises(SystemExit) as stopped:
        rlhf_in_process(["gc", "--keep-runs", "-1"], capfd)
    assert stopped.value.code == 2 and "expected 0 or more" in capfd.readouterr().err
    out = rlhf_in_process(["gc", "--config", str(TEST_CONFIG), "--set",
                           f"tracking.tracking_uri=sqlite:///{tmp_path}/none.db"], capfd)
    assert out.returncode == 2 and "no MLflow store at" in out.stderr
    assert not (tmp_path / "none.db").exists()

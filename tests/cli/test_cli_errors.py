"""Expected failures end with one short paragraph naming the field or file and the fix, exit
1 or 2, and no Python traceback on the terminal (checked on the real process output)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "test.yaml"


def rlhf(args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_LOGGING_LEVEL": "INFO", **env}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def assert_one_paragraph(proc, code: int, *needles: str) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    last = proc.stderr.strip().split("\n\n")[-1]
    for needle in needles:
        assert needle in last, last
    return last


@pytest.mark.parametrize("overrides, needles", [
    (["model.base_model=/nope"], ["model.base_model=/nope", "does not exist", "hub id"]),
    (["demo.enabled=false"], ["neither a `data:` section", "demo.enabled: true"]),
    (["model.base_model=not a hub id!"], ["neither an existing local folder nor a hub id"]),
    # a password no variable of MLflow's can take: never a Prefect parameter, refused
    (["tracking.tracking_uri=postgresql+psycopg://bob:s3cret@127.0.0.1:9/mlflow"],
     ["tracking.tracking_uri holds a password", "bob:***@", "set MLFLOW_TRACKING_URI"]),
    (["collect.destination.url=http://bob:s3cret@127.0.0.1:9"],
     ["collect.destination.url holds a password", "set LABEL_STUDIO_URL"]),
])
def test_bad_setting_fails_before_anything_starts(tmp_path, overrides, needles):
    sets = [a for o in overrides for a in ("--set", o)]
    proc = rlhf(["run", "--config", str(CONFIG), *sets], cwd=tmp_path)
    assert_one_paragraph(proc, 2, *needles)
    assert "s3cret" not in proc.stdout + proc.stderr
    assert "Starting temporary server" not in proc.stderr  # Prefect never started
    assert list(tmp_path.iterdir()) == []  # no mlflow.db, no run folder


def test_workdir_that_is_a_file_is_refused_before_a_run_opens(tmp_path):
    (tmp_path / "afile").write_text("x")
    proc = rlhf(["run", "--config", str(CONFIG), "--set", f"tracking.workdir={tmp_path}/afile"],
                cwd=tmp_path)
    assert_one_paragraph(proc, 2, "tracking.workdir=", "is a file")
    assert not (tmp_path / "mlflow.db").exists()


def test_data_gate_failure_is_a_sentence_with_rows_and_file_and_exit_1(tmp_path, prefect_api):
    from rlhf_core.demo import DemoSizes, generate_demo_data

    files = generate_demo_data(tmp_path / "data", 0, DemoSizes(64, 64, 32, 16, 16))
    rows = [json.loads(line) for line in files["preference"].read_text().splitlines()]
    for i in (0, 3):
        rows[i]["rejected"] = rows[i]["chosen"]
    files["preference"].write_text("".join(json.dumps(r) + "\n" for r in rows))
    sets = [a for role in ("sft", "preference", "prompts")
            for a in ("--set", f"data.{role}.path={files[role]}")]
    uri = f"sqlite:///{tmp_path}/m.db"
    proc = rlhf(["run", "--config", str(CONFIG), *sets, "--set", f"tracking.tracking_uri={uri}",
                 "--set", f"tracking.workdir={tmp_path}/runs"], cwd=tmp_path,
                PREFECT_API_URL=prefect_api)
    last = assert_one_paragraph(proc, 1, f"preference ({files['preference']})",
                                "2 pairs have chosen == rejected: rows 1, 4")
    assert len(last.splitlines()) <= 4
    client = MlflowClient(uri)
    (parent,) = [r for r in client.search_runs(
        [client.get_experiment_by_name("rlhf-test").experiment_id])
        if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.status == "FAILED"
    (validate,) = client.search_runs([parent.info.experiment_id],
                                     f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
    kept = client.download_artifacts(validate.info.run_id, "error/traceback.txt", str(tmp_path))
    assert "ValidationFailed" in Path(kept).read_text()  # the traceback went to MLflow


def test_a_failure_after_the_parent_run_opened_marks_it_failed(tmp_path, monkeypatch):
    import tasks.pipeline.prepare as prepare
    from tasks.config.pipeline_config import load_config

    def broken(*_):
        raise OSError("disk full")

    monkeypatch.setattr(prepare, "demo_assets", broken)
    monkeypatch.setattr(prepare, "_prefect_flow_run_id", lambda: None)
    cfg = load_config(CONFIG, [f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db",
                               f"tracking.workdir={tmp_path}/runs"])
    with pytest.raises(OSError, match="disk full"):
        prepare.prepare.fn(cfg)
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    (run,) = client.search_runs([client.get_experiment_by_name("rlhf-test").experiment_id])
    assert run.info.status == "FAILED"


@pytest.mark.parametrize("args, env, needles", [
    (["label", "pull"], {"LABEL_STUDIO_URL": "http://127.0.0.1:{port}",
                         "LABEL_STUDIO_API_KEY": "x"},
     ["Label Studio at http://127.0.0.1:", "does not answer", "label-studio start"]),
    (["collect", "--to", "label-studio"], {"LABEL_STUDIO_URL": "http://127.0.0.1:{port}"},
     ["LABEL_STUDIO_API_KEY is not set", "Account & Settings"]),
    (["collect", "--to", "label-studio"], {}, ["no Label Studio server: set LABEL_STUDIO_URL"]),
])
def test_label_studio_faults_stop_before_anything_starts(tmp_path, args, env, needles):
    import time

    from tests.servers import free_port

    port = free_port()
    env = {k: v.format(port=port) for k, v in env.items()}
    base = {k: "" for k in ("LABEL_STUDIO_URL", "LABEL_STUDIO_API_KEY")}
    start = time.perf_counter()
    proc = rlhf([*args, "--config", str(CONFIG), "--set",
                 f"tracking.tracking_uri=sqlite:///{tmp_path}/mlflow.db", "--set",
                 "retrain.gate.min_prompts=16"], tmp_path,  # a config that can be retrained
                **{**base, **env})
    assert time.perf_counter() - start < 30  # a guard; the CLI's own check is one 5 s try
    assert_one_paragraph(proc, 2, *needles)

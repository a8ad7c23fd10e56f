"""Faults found before anything starts: an MLflow store or Prefect API that does not answer,
and bad inputs (a binary or duplicate-key config, CUDA without CUDA, a workdir that cannot be
made, a stage's child run id given to --resume). Each ends in one sentence and exit 2, within
seconds, with nothing created."""

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager

import pytest
from mlflow.tracking import MlflowClient

from cli.main import main
from tasks.config.pipeline_config import ConfigError, load_config
from tasks.platform.prefect.preflight import check_config, check_servers
from tests.shared import ROOT, TEST_CONFIG


def closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def silent_server():
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"http://127.0.0.1:{s.getsockname()[1]}"


def rlhf(args, cwd, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def one_sentence(proc) -> str:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    return line


def test_run_with_an_unreachable_tracking_server_fails_in_seconds(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    start = time.perf_counter()
    proc = rlhf(["run", "--config", str(TEST_CONFIG)], tmp_path, MLFLOW_TRACKING_URI=url)
    assert time.perf_counter() - start < 10
    line = one_sentence(proc)
    assert f"MLflow tracking server at {url} (from MLFLOW_TRACKING_URI) does not answer" in line
    assert list(tmp_path.iterdir()) == []  # no store, no run folder, Prefect never started


def test_run_with_an_unreachable_prefect_api_fails_in_seconds(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/api"
    start = time.perf_counter()
    proc = rlhf(["run", "--config", str(TEST_CONFIG), "--set",
                 f"tracking.tracking_uri=sqlite:///{tmp_path}/m.db"], tmp_path,
                PREFECT_API_URL=url)
    assert time.perf_counter() - start < 10
    line = one_sentence(proc)
    assert f"Prefect API at {url} (from PREFECT_API_URL) does not answer" in line
    assert "prefect server start" in line and list(tmp_path.iterdir()) == []


def test_a_server_that_never_answers_is_given_up_after_the_timeout(monkeypatch):
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with silent_server() as url:
        start = time.perf_counter()
        with pytest.raises(ConfigError, match="does not answer .no answer; one try of up to 1 s"):
            check_servers(url, prefect=False, timeout_s=1)
        monkeypatch.setenv("PREFECT_API_URL", url + "/api")
        with pytest.raises(ConfigError, match=r"Prefect API at .*/api \(from PREFECT_API_URL\)"):
            check_servers(None, mlflow=False, timeout_s=1)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("uri, needle", [
    ("sqlite:////proc/rlhf/m.db", "its folder /proc/rlhf: cannot create a folder in /proc"),
    ("postgresql+psycopg://u@127.0.0.1:{port}/db", "database at postgresql"),
])
def test_stores_that_cannot_be_used(uri, needle, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(port=closed_port()))
    assert main(["runs"]) == 2
    assert needle in capsys.readouterr().err


def test_promote_checks_the_store_named_in_the_config(capsys):
    url = f"http://127.0.0.1:{closed_port()}"
    assert main(["promote", "1", "--set", f"tracking.tracking_uri={url}"]) == 2
    assert f"{url} (from tracking.tracking_uri in the config) does not answer" in \
        capsys.readouterr().err


@pytest.mark.parametrize("args", [["collect"], ["retrain"], ["demo-batch"],
                                  ["label", "import", "{file}"]])
def test_retrain_loop_commands_check_the_store_first(args, tmp_path, capsys):
    labelled = tmp_path / "labels.jsonl"
    labelled.write_text("{}\n")
    url = f"http://127.0.0.1:{closed_port()}"
    argv = [a.format(file=labelled) for a in args] + ["--set", f"tracking.tracking_uri={url}"]
    assert main(argv) == 2
    assert f"{url} (from tracking.tracking_uri in the config) does not answer" in \
        capsys.readouterr().err


def test_a_binary_config_file_is_refused(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_bytes(b"seed: 1\n\x00\x9f\xff\xfe random bytes")
    with pytest.raises(ConfigError, match=r"cfg.yaml: not a text config file \(byte 0x9f on "
                                          r"line 2 is not UTF-8\)"):
        load_config(path)


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("seed: 1\nppo:\n  iterations: 2\nsft: {epochs: 1}\nppo:\n  kl_coef: 0.1\n")
    with pytest.raises(ConfigError, match="key 'ppo' appears twice in one section, on lines 2 "
                                          "and 5"):
        load_config(path)
    path.write_text("ppo: {iterations: 2, kl_coef: 0.1, iterations: 3}\n")
    with pytest.raises(ConfigError, match="key 'iterations' .* on lines 1 and 1"):
        load_config(path)


def test_cuda_on_a_machine_without_it_names_the_device_there():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cfg = load_config(TEST_CONFIG, ["model.device=cuda"])
    with pytest.raises(ConfigError, match=r"model.device=cuda: this machine's torch .* the "
                                          r"device here is (cpu|mps), so set model.device="):
        check_config(cfg)


def test_a_workdir_that_cannot_be_created_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"tracking.workdir=/proc/rlhf: cannot create a folder "
                                          r"in /proc"):
        check_config(load_config(TEST_CONFIG, ["tracking.workdir=/proc/rlhf"]))
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=f"{tmp_path}/file is a file, not a folder"):
        check_config(load_config(TEST_CONFIG, [f"tracking.workdir={tmp_path}/file/sub"]))
    check_config(load_config(TEST_CONFIG, [f"tracking.workdir={tmp_path}/new/sub"]))
    assert [p.name for p in tmp_path.iterdir()] == ["file"]  # the probes left nothing


def test_resume_with_a_stage_child_run_id_names_the_parent(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("rlhf-test")
    parent = client.create_run(exp).info.run_id
    child = client.create_run(exp, run_name="sft", tags={"mlflow.parentRunId": parent,
                                                          "rlhf.stage": "sft"}).info.run_id
    args = ["run", "--config", str(TEST_CONFIG), "--set", f"tracking.tracking_uri={uri}",
            "--resume", child]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert f"--resume {child}: that is the `sft` child run of the pipeline run {parent}" in err
    assert f"rlhf run --config {TEST_CONFIG} --set tracking.tracking_uri={uri} --resume " \
           f"{parent}" in err


def test_a_health_scorer_missing_from_the_registry_is_refused_before_prefect(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = rlhf(["run", "--config", str(TEST_CONFIG), "--set",
                 "ppo.health.scorer=models:/big-judge@prod", "--set",
                 f"tracking.tracking_uri={uri}", "--set",
                 f"tracking.workdir={tmp_path}/runs"], tmp_path,
                PREFECT_HOME=str(tmp_path / "prefect"))
    line = one_sentence(proc)
    assert line.startswith("rlhf: ppo.health.scorer=models:/big-judge@prod: no version of "
                           "registered model 'big-judge' holds alias 'prod' in the registry")
    assert not (tmp_path / "runs").exists()  # nothing trained, no run folder
    assert "temporary server" not in proc.stdout + proc.stderr  # Prefect never started

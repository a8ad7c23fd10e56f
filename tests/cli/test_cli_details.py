"""CLI and tracking details a user trips on: --version, --help, read-only and light `rlhf runs`,
errors that name the --set override or the unknown run id, the summary's links and registered
models, run names, the experiment kind, and a new SQLite store opened by several runs at once."""

import os
import socket
import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from cli.main import build_parser, main, summary_text
from tasks.config.pipeline_config import ConfigError, load_config
from tasks.pipeline.results import PipelineResult
from tasks.pipeline.stages.records import RegisterRecord
from tests.shared import ROOT, TEST_CONFIG


def test_version_and_help(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.startswith("rlhf 0.")
    text = build_parser().format_help()
    for needle in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "./mlflow.db", "tracking.workdir"):
        assert needle in text, needle


def test_runs_in_a_folder_without_a_store_creates_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["runs"]) == 2
    assert "no MLflow store at sqlite:///mlflow.db" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_runs_limit_zero_is_a_usage_error_not_a_traceback(capsys):
    with pytest.raises(SystemExit) as done:
        main(["runs", "--limit", "0"])
    assert done.value.code == 2 and "must be 1 or more" in capsys.readouterr().err


def test_runs_pages_through_the_pipeline_runs_newest_first(tmp_path, monkeypatch, capsys):
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("rlhf-demo")
    ids = [client.create_run(exp, start_time=1_000_000 * (n + 1), run_name=f"run-{n}",
                             tags={"rlhf.config_hash": "h"}).info.run_id for n in range(5)]
    client.create_run(exp, start_time=9_000_000, run_name="a-collection")  # no pipeline run
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)

    def page(n: int) -> str:
        assert main(["runs", "--limit", "2", "--page", str(n)]) == 0
        return capsys.readouterr().out

    first, second, third, fourth = page(1), page(2), page(3), page(4)
    listed = [sorted((i for i in ids if i in text), key=text.index)
              for text in (first, second, third)]
    assert listed == [[ids[4], ids[3]], [ids[2], ids[1]], [ids[0]]]  # newest first
    assert "a-collection" not in first
    assert "--limit 2 --page 3" in second and "older runs" not in third
    assert "(no runs on page 4: fewer than 7 runs)" in fourth


def test_runs_on_a_sqlite_store_loads_no_mlflow_pandas_or_torch(tmp_path):
    """`rlhf runs` reads a local store with SQL: a fresh interpreter that ran it has not
    imported MLflow, pandas, torch or Prefect, and lists the run."""
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    run = client.create_run(client.create_experiment("rlhf-demo"), run_name="round-1",
                            tags={"rlhf.config_hash": "h"})
    client.log_metric(run.info.run_id, "eval/kl_to_ref", 0.25)
    probe = ("import sys; from cli.main import main; code = main(['runs']); print(sorted(m for "
             "m in ('mlflow', 'pandas', 'torch', 'transformers', 'prefect') if m in sys.modules"
             "), code)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert out.stdout.strip().splitlines()[-1] == "[] 0"
    assert run.info.run_id in out.stdout and "round-1" in out.stdout and "0.250" in out.stdout


def test_gc_and_the_label_flows_load_no_torch(tmp_path):
    """`rlhf gc` and the label commands' flows (import, pull, collect's module) move files and
    talk to servers: a fresh interpreter that ran a dry `rlhf gc` and imported flows.collect
    has not imported torch or transformers (their import alone is seconds of CPU)."""
    uri = f"sqlite:///{tmp_path}/m.db"
    MlflowClient(uri).create_experiment("rlhf-demo")
    probe = ("import sys; from cli.main import main; code = main(['gc', '--set', "
             f"'tracking.tracking_uri={uri}', '--set', 'tracking.workdir={tmp_path}/runs']); "
             "import flows.collect, tasks.gc.plan; "
             "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules), code)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    assert out.stdout.strip().splitlines()[-1] == "[] 0", out.stdout + out.stderr
    assert "would delete 0 item(s)" in out.stdout


def test_runs_gives_up_quickly_on_an_unreachable_server(monkeypatch, capsys):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    start = time.perf_counter()
    assert main(["runs"]) == 2
    assert time.perf_counter() - start < 30
    assert f"MLflow tracking server at http://127.0.0.1:{port} (from MLFLOW_TRACKING_URI)" in \
        capsys.readouterr().err


def test_resume_with_an_unknown_run_id_fails_before_prefect(tmp_path, capsys):
    uri = f"sqlite:///{tmp_path}/m.db"
    MlflowClient(uri).search_experiments()  # an existing store without that run
    code = main(["run", "--config", str(TEST_CONFIG), "--set", f"tracking.tracking_uri={uri}",
                 "--resume", "0123456789abcdef0123456789abcdef"])
    assert code == 2
    assert "--resume 0123456789abcdef0123456789abcdef: the MLflow store" in \
        capsys.readouterr().err


def test_a_bad_override_is_named_as_the_override_not_the_file():
    with pytest.raises(ConfigError) as err:
        load_config(TEST_CONFIG, ["ppo.kl_coef=-1"])
    assert "(from --set ppo.kl_coef=-1)" in str(err.value)
    assert "test.yaml" not in str(err.value)



def test_a_bad_value_in_the_file_is_named_with_the_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("ppo: {kl_coef: -1}\n")
    with pytest.raises(ConfigError, match="invalid config in .*mine.yaml"):
        load_config(path, [])


def test_summary_links_a_server_run_and_lists_the_registered_versions():
    reg = RegisterRecord(registered=True, model_name="rlhf-policy", version=4,
                         reward_model_name="rlhf-rm", reward_model_version=2, wall_s=1.0)
    result = PipelineResult(parent_run_id="abc", experiment_id="3", workdir="/w",
                            tracking_uri="http://mlflow.example:5000/", stages={"register": reg})
    text = summary_text(result, 1.0)
    assert "view: http://mlflow.example:5000/#/experiments/3/runs/abc" in text
    # the runs table in "Model training" mode, whatever the UI's switch remembers
    assert "runs table: http://mlflow.example:5000/#/experiments/3/runs?workflowType=" \
        "machine_learning" in text
    assert "--backend-store-uri http" not in text
    assert "registered policy: models:/rlhf-policy/4 (challenger)" in text
    assert "registered reward model: models:/rlhf-rm/2 (challenger)" in text
    promoted = result.model_copy(update={"stages": {"register": reg.model_copy(
        update={"promoted": True})}})
    assert "registered policy: models:/rlhf-policy/4 (champion)" in summary_text(promoted, 1.0)
    nothing = result.model_copy(update={"stages": {"register": RegisterRecord(registered=False)}})
    assert "registered" not in summary_text(nothing, 1.0)


def test_run_names_start_with_the_time_and_the_experiment_opens_on_training_runs(tmp_path):
    from tasks.pipeline.prepare import default_run_name
    from tasks.platform.mlflow.runs import ensure_experiment

    cfg = load_config(TEST_CONFIG, [])
    assert default_run_name(cfg)[:8] == time.strftime("%Y%m%d")
    uri = f"sqlite:///{tmp_path}/m.db"
    client = MlflowClient(uri)
    old = client.create_experiment("before")  # made by an older version: tagged on reuse
    for name in ("new", "before"):
        exp = client.get_experiment(ensure_experiment(client, name, uri))
        assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    assert client.get_experiment(old).tags["mlflow.experimentKind"]


def test_several_runs_opening_a_new_sqlite_store_at_once_all_succeed(tmp_path):
    uri = f"sqlite:///{tmp_path}/new.db"
    code = (f"from tasks.platform.mlflow.runs import ensure_store; ensure_store({uri!r}); "
            "print('ok')")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [e[-2000:] for _, e in outs]
    assert MlflowClient(uri).search_experiments()

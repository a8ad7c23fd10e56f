"""A Prefect API that stops answering mid-run ends `rlhf run` with exit 75 and one sentence
saying what is kept and the command that continues the run (no traceback)."""

import httpx

import cli.main as cli
from tasks.platform.mlflow import errors as mlflow_errors


def test_a_prefect_api_gone_ends_with_the_resume_command(monkeypatch, capsys):
    def lost(args):
        try:
            raise httpx.ConnectError("[Errno 111] Connection refused")
        except httpx.ConnectError as err:
            raise RuntimeError("could not report the task run's state") from err

    monkeypatch.setattr(cli, "cmd_run", lost)
    monkeypatch.setattr(mlflow_errors, "_LAST_PARENT", ["abc123"])
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert cli.main(["run", "--set", "seed=1"]) == 75
    err = capsys.readouterr().err.strip()
    assert err == ("rlhf: the Prefect API at http://127.0.0.1:9/api stopped answering "
                   "(RuntimeError: could not report the task run's state); run abc123 keeps "
                   "its finished stages and the last checkpoint of the stage it was in; once "
                   "the server answers, continue it with: rlhf run --set seed=1 --resume abc123")

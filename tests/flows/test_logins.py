"""Shared servers with logins: a real `mlflow server --app-name basic-auth` (its own user
store, admin password and secret key from the test) and a real Prefect server with
PREFECT_SERVER_API_AUTH_STRING, both on 127.0.0.1, ended by their PIDs.

A wrong, missing or read-only login, or one that may not register the models, ends
`rlhf run` in seconds with exit 2 and one sentence naming the server and what to fix (each a
CLI call that stops in its preflight). One pipeline runs with the right logins, its MLflow
login written into the tracking URI; its password is changed between two stages, which stops
the run like an outage, with one sentence and the `--resume` command; resumed with the new
password it finishes. No password or auth string is then found in any param, tag, artifact,
Prefect parameter, artifact or log, nor in what the CLI printed.
"""

import base64
import json
import os
import secrets
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests import servers
from tests.flows.prefect_procs import prefect_server
from tests.shared import TEST_CONFIG, pipeline_stages

ADMIN = ("admin", f"admin-{secrets.token_hex(8)}")
ALICE = ("alice", f"alice-{secrets.token_hex(8)}")          # EDIT on experiment and RM
READER = ("reader", f"reader-{secrets.token_hex(8)}")       # READ only (the default)
NOREG = ("noreg", f"noreg-{secrets.token_hex(8)}")          # EDIT on the experiment only
APPROVER = ("carol", f"carol-{secrets.token_hex(8)}")       # MANAGE on a policy she approves
AUTH_STRING = f"team:{secrets.token_hex(8)}"
SETTINGS = ["ppo.iterations=2", "tracking.system_metrics=false", "demo.n_sft=64",
            "demo.n_pref=64", "demo.n_eval=8", "demo.n_pref_eval=16", "eval.num_prompts=8",
            "model.torch_threads=1", "tracking.progress=true"]
TIMES: dict[str, float] = {}  # seconds to the message, per case (printed with -s)


@pytest.fixture(scope="module")
def mlflow_auth(tmp_path_factory):
    """The basic-auth server with experiment rlhf-test and registered model
    rlhf-reward-model (both the admin's), alice granted EDIT on both, noreg EDIT on the
    experiment; rlhf-policy is left to be created by the run (its alias read first)."""
    tmp = tmp_path_factory.mktemp("mlflow-auth")
    port = servers.free_port()
    env = servers.auth_env(tmp, ADMIN[1], secret_key=secrets.token_hex(16))
    proc = servers.start_mlflow(f"sqlite:///{tmp}/store.db", tmp, port, app_name="basic-auth",
                                env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for user, password in (ALICE, READER, NOREG):
            servers.rest(url, "2.0/mlflow/users/create", ADMIN, "POST",
                         {"username": user, "password": password})
        exp = servers.rest(url, "2.0/mlflow/experiments/create", ADMIN, "POST",
                           {"name": "rlhf-test"})["experiment_id"]
        servers.rest(url, "2.0/mlflow/registered-models/create", ADMIN, "POST",
                     {"name": "rlhf-reward-model"})
        for user, kind, name in ((ALICE, "experiment", exp),
                                 (ALICE, "registered_model", "rlhf-reward-model"),
                                 (NOREG, "experiment", exp)):
            servers.rest(url, "3.0/mlflow/users/permissions/grant", ADMIN, "POST",
                         {"username": user[0], "resource_type": kind, "resource_id": name,
                          "permission": "EDIT"})
        yield url, tmp
    finally:
        servers.stop(proc)


@pytest.fixture(scope="module")
def prefect_auth(tmp_path_factory):
    """A Prefect server asking for AUTH_STRING -> (api URL, client env without a login)."""
    home = tmp_path_factory.mktemp("prefect-auth")
    with prefect_server(home, {"PREFECT_SERVER_API_AUTH_STRING": AUTH_STRING}) as (api, env):
        env.pop("PREFECT_SERVER_API_AUTH_STRING")
        yield api, env


def rlhf_env(prefect_auth, mlflow_url: str, login=None, auth=AUTH_STRING) -> dict:
    env = {**prefect_auth[1], "MLFLOW_TRACKING_URI": mlflow_url}
    if login:
        env.update(MLFLOW_TRACKING_USERNAME=login[0], MLFLOW_TRACKING_PASSWORD=login[1])
    if auth:
        env["PREFECT_API_AUTH_STRING"] = auth
    return env


def run_args(*settings: str) -> list[str]:
    args = [sys.executable, "-m", "cli", "run", "--config", str(TEST_CONFIG)]
    for item in [*SETTINGS, *settings]:
        args += ["--set", item]
    return args


WRONG = ("alice", "not-the-password-1")
CASES = {  # case: (MLflow login, Prefect auth string, what the sentence says)
    "mlflow-wrong": (WRONG, AUTH_STRING, [
        "refused the login of user 'alice' read from MLFLOW_TRACKING_USERNAME/"
        "MLFLOW_TRACKING_PASSWORD (HTTP 401 Unauthorized)"]),
    "mlflow-missing": (None, AUTH_STRING, [
        "asks for a login and none was given (HTTP 401): set MLFLOW_TRACKING_USERNAME and "
        "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"]),
    "mlflow-read-only": (READER, AUTH_STRING, [
        "user 'reader' has READ on the experiment 'rlhf-test'", "needs EDIT (to log runs"]),
    "mlflow-no-register": (NOREG, AUTH_STRING, [
        "user 'noreg' has READ on the registered model 'rlhf-reward-model'",
        "needs EDIT (to register versions"]),
    "prefect-wrong": (ALICE, "team:wrong", [
        "the Prefect API at", "refused the login read from PREFECT_API_AUTH_STRING "
        "(HTTP 401 Unauthorized)"]),
    "prefect-missing": (ALICE, None, [
        "asks for a login and none was given (HTTP 401): set PREFECT_API_AUTH_STRING"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_login_that_will_not_do_ends_in_seconds_with_one_sentence(case, mlflow_auth,
                                                                    prefect_auth, tmp_path):
    login, auth, needles = CASES[case]
    url = mlflow_auth[0]
    start = time.perf_counter()
    proc = subprocess.run(run_args(f"tracking.workdir={tmp_path / 'runs'}"), cwd=tmp_path,
                          env=rlhf_env(prefect_auth, url, login, auth), capture_output=True,
                          text=True, timeout=120)
    TIMES[case] = took = time.perf_counter() - start
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and "Traceback" not in out, out[-3000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    print(f"\n[{case}] {took:.1f} s: {line}")
    assert line.startswith("rlhf: the "), line
    for needle in needles:
        assert needle in line, (needle, line)
    assert took < 30, took  # a guard; the message comes in a few seconds
    assert list(tmp_path.iterdir()) == []  # no run folder: nothing started


def prefect_records(api: str, what: str) -> str:
    """Every flow run, artifact or log of the Prefect server, as JSON text (page by page)."""
    headers = {"Content-Type": "application/json",
               "Authorization": "Basic " + base64.b64encode(AUTH_STRING.encode()).decode()}
    pages, offset = [], 0
    while True:
        request = urllib.request.Request(
            f"{api}/{what}/filter", method="POST", headers=headers,
            data=json.dumps({"limit": 200, "offset": offset}).encode())
        with urllib.request.urlopen(request, timeout=30) as resp:
            page = json.loads(resp.read())
        pages += page
        offset += len(page)
        if len(page) < 200:
            return json.dumps(pages)


def stopped_when_paused(args, env: dict, pause_at: str, change, log) -> tuple[str, float]:
    """Run ``args`` until the pause point ``pause_at``, ``change()`` the login there, let
    it go on -> (its last line, seconds from the change to its exit with 75)."""
    pause = Path(env["RLHF_PAUSE_FILE"])
    with open(log, "w") as out:
        proc = subprocess.Popen(args, cwd=log.parent, env={**env, "RLHF_PAUSE_AT": pause_at},
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 240
        while not pause.exists():
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        change()
        changed = time.time()
        pause.unlink()
        assert proc.wait(timeout=120) == 75, log.read_text()[-3000:]
    finally:
        proc.kill()
    text = log.read_text()
    assert "Traceback" not in text, text[-3000:]
    return text.strip().splitlines()[-1], time.time() - changed


def grant(url: str, exp_id: str, permission: str | None) -> None:
    """Alice's permission on the experiment (None: revoked, the default READ is left)."""
    body = {"username": "alice", "resource_type": "experiment", "resource_id": exp_id}
    if permission:
        servers.rest(url, "3.0/mlflow/users/permissions/grant", ADMIN, "POST",
                     {**body, "permission": permission})
    else:
        servers.rest(url, "3.0/mlflow/users/permissions/revoke", ADMIN, "POST", body)


def test_a_run_with_logins_stops_when_its_password_changes_and_resumes(
        mlflow_auth, prefect_auth, tmp_path, monkeypatch):
    """The login is changed twice mid-run: alice's password before reward_model (401),
    then, in the resumed run, her EDIT on the experiment revoked before register (403)."""
    url, server_dir = mlflow_auth
    new_password = f"alice-new-{secrets.token_hex(8)}"
    host = url.removeprefix("http://")
    env = {**rlhf_env(prefect_auth, url), "PREFECT_LOGGING_LEVEL": "INFO",
           "RLHF_PAUSE_FILE": str(tmp_path / "paused")}
    env.pop("MLFLOW_TRACKING_URI")  # the config names the server, login included
    args = run_args(f"tracking.workdir={tmp_path / 'runs'}",
                    f"tracking.tracking_uri=http://alice:{ALICE[1]}@{host}")
    last, took = stopped_when_paused(
        args, env, "before:reward_model", lambda: servers.rest(
            url, "2.0/mlflow/users/update-password", ADMIN, "PATCH",
            {"username": "alice", "password": new_password}), tmp_path / "first.log")
    TIMES["mid-run password change"] = took
    print(f"\n[mid-run password change] {took:.1f} s: {last}")
    assert last.startswith(f"rlhf: the MLflow server at {url} refused user 'alice' (HTTP 401"), \
        last
    assert "keeps its finished stages" in last, last
    assert "once the login is fixed, continue it with: rlhf run " in last, last
    assert took < 30, took
    command = shlex.split(last.split("continue it with: ")[1])
    assert f"tracking.tracking_uri=http://alice:***@{host}" in command, command
    command = [sys.executable, "-m", "cli",
               *[a.replace("alice:***@", f"alice:{new_password}@") for a in command[1:]]]
    exp_id = servers.rest(url, "2.0/mlflow/experiments/get-by-name?experiment_name=rlhf-test",
                          ADMIN)["experiment"]["experiment_id"]
    last, took = stopped_when_paused(command, env, "before:register",
                                     lambda: grant(url, exp_id, None), tmp_path / "second.log")
    TIMES["mid-run permission revoked"] = took
    print(f"\n[mid-run permission revoked] {took:.1f} s: {last}")
    assert last.startswith(f"rlhf: the MLflow server at {url} refused user 'alice' (HTTP 403 "
                           "Permission denied: a permission it needs was taken away; at "), last
    assert " --resume " in last and took < 30, (took, last)
    grant(url, exp_id, "EDIT")
    resumed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN[1])
    client = MlflowClient(url)
    exp = client.get_experiment_by_name("rlhf-test")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert parent.info.run_id == command[command.index("--resume") + 1]
    assert parent.info.status == "FINISHED"
    children = servers.stage_children(client, parent)
    assert set(children) == set(pipeline_stages())
    assert {r.info.status for r in children.values()} == {"FINISHED"}
    # the first policy is promoted (champion, no longer challenger); the RM stays challenger
    for name, alias in (("rlhf-policy", "champion"), ("rlhf-reward-model", "challenger")):
        assert client.get_model_version_by_alias(name, alias).run_id == \
            children["register"].info.run_id
    assert parent.data.params["tracking.tracking_uri"] == url

    hidden = [ALICE[1], new_password, AUTH_STRING]
    recorded = {f"{r.info.run_id} params/tags": json.dumps([r.data.params, r.data.tags])
                for r in runs}
    for log in ("first.log", "second.log"):
        recorded[f"CLI, {log}"] = (tmp_path / log).read_text()
    recorded["CLI, resumed run"] = resumed.stdout + resumed.stderr
    for what in ("flow_runs", "artifacts", "logs"):
        recorded[f"Prefect {what}"] = prefect_records(prefect_auth[0], what)
    for path in [server_dir / "store.db", *sorted((server_dir / "artifacts").rglob("*")),
                 *sorted((tmp_path / "runs").rglob("*"))]:
        if path.is_file():
            recorded[str(path)] = path.read_bytes().decode("utf-8", "replace")
    assert len(recorded) > 50  # every artifact file of every run, the store, the checkpoints
    leaks = [(where, secret[:6]) for where, content in recorded.items() for secret in hidden
             if secret in content]
    assert not leaks, leaks
    print(f"\nsearched {len(recorded)} records for the passwords; times: {TIMES}")


def test_rlhf_approve_on_a_server_with_logins_records_the_login(mlflow_auth, prefect_auth,
                                                               tmp_path, monkeypatch):
    """A candidate waiting on the basic-auth server (made as the admin, on a policy of its
    own): a read-only login, and one that may edit the policy but not remove its aliases
    (EDIT, not MANAGE), are refused before anything is written; carol's approval (MANAGE)
    makes it champion and is recorded as hers."""
    from tasks.platform.mlflow.registry import CHAMPION, move_champion
    from tasks.platform.mlflow.tags import CHAMPION_VERSION_TAG, PIPELINE_RUN_TAG
    from tasks.retrain.approval.answers import request_approval

    url, _ = mlflow_auth
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", ADMIN[0])
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN[1])
    admin, name = MlflowClient(url), "approval-policy"
    exp = admin.get_experiment_by_name("rlhf-test").experiment_id
    admin.create_registered_model(name)
    versions = []
    for _ in range(2):
        run = admin.create_run(exp).info.run_id
        admin.set_terminated(run)
        versions.append(admin.create_model_version(name, f"runs:/{run}/model", run).version)
        admin.set_model_version_tag(name, versions[-1], PIPELINE_RUN_TAG, run)
    move_champion(admin, name, versions[0], "register", "first")
    admin.set_model_version_tag(name, versions[1], CHAMPION_VERSION_TAG, str(versions[0]))
    request_approval(admin, name, versions[1], run, 72)
    servers.rest(url, "2.0/mlflow/users/create", ADMIN, "POST",  # alice's password may
                 {"username": APPROVER[0], "password": APPROVER[1]})  # have changed already
    servers.rest(url, "3.0/mlflow/users/permissions/grant", ADMIN, "POST", {
        "username": APPROVER[0], "resource_type": "experiment", "resource_id": exp,
        "permission": "EDIT"})
    for user, level in ((APPROVER, "MANAGE"), (NOREG, "EDIT")):
        servers.rest(url, "3.0/mlflow/users/permissions/grant", ADMIN, "POST", {
            "username": user[0], "resource_type": "registered_model", "resource_id": name,
            "permission": level})
    args = [sys.executable, "-m", "cli", "approve", "--reason", "read the evidence",
            "--config", str(TEST_CONFIG), "--set", f"tracking.registered_policy={name}"]
    for login, says in ((READER, "user 'reader' has READ on the experiment"),
                        (NOREG, f"user 'noreg' has EDIT on the registered model '{name}'")):
        refused = subprocess.run(args, cwd=tmp_path, env=rlhf_env(prefect_auth, url, login),
                                 capture_output=True, text=True, timeout=120)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr[-2000:]
    assert "needs MANAGE (to move and remove its aliases" in refused.stderr
    assert str(admin.get_model_version_by_alias(name, CHAMPION).version) == str(versions[0])
    done = subprocess.run(args, cwd=tmp_path, env=rlhf_env(prefect_auth, url, APPROVER),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "approved by carol (cli" in done.stdout, done.stdout
    assert str(admin.get_model_version_by_alias(name, CHAMPION).version) == str(versions[1])
    tags = admin.get_model_version(name, versions[1]).tags
    assert (tags["rlhf.approval.by"], tags["rlhf.approval.status"]) == ("carol", "approved")
    assert admin.get_run(run).data.tags["rlhf.approval.by"] == "carol"


def test_a_login_in_the_uri_moves_into_mlflows_variables(monkeypatch):
    from tasks.config.pipeline_config import load_config
    from tasks.platform.prefect.logins import login_out_of_uri
    from tasks.platform.redact import redacted

    for var in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
        monkeypatch.setenv(var, "")  # (restored after the test, set or not)
        monkeypatch.delenv(var)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "https://carol:p%40ss@mlflow.example:443/x")
    cfg = login_out_of_uri(load_config(TEST_CONFIG, ["tracking.tracking_uri="
                                                     "http://bob:secret@host:5000"]))
    assert cfg.tracking.tracking_uri == "http://host:5000"
    assert os.environ["MLFLOW_TRACKING_URI"] == "https://mlflow.example:443/x"
    assert (os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]) \
        == ("bob", "secret")  # the config's wins, as it names the store used
    assert redacted({"a": ["postgresql+psycopg://u:pw@db:5432/m", "http://h:1"]}) == \
        {"a": ["postgresql+psycopg://u:***@db:5432/m", "http://h:1"]}

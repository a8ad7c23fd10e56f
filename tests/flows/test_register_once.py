"""Registration happens once: a run SIGKILLed inside register (after the policy's version
appeared, the reward model's not yet; then, resumed, after both were tagged and made
challenger) and resumed leaves one version per registered model, tagged, its aliases moved
once."""

import json
import os
import signal
import subprocess
import sys

from mlflow.tracking import MlflowClient

from tests.servers import stage_children
from tests.shared import ROOT, TEST_CONFIG, rlhf_in_process
from tests.stores import seed_sqlite_store


def run_args(tmp_path, *extra) -> list[str]:
    return ["run", "--config", str(TEST_CONFIG), "--set", f"tracking.workdir={tmp_path}/runs",
            "--set", "tracking.run_name=once", "--set", "tracking.system_metrics=false", *extra]


def rlhf_run(tmp_path, env, crash_at: str, *extra) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli", *run_args(tmp_path, *extra)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**env, "RLHF_CRASH_AT": crash_at})


def test_a_crash_inside_register_then_resume_registers_each_model_once(prefect_api, tmp_path,
                                                                     capfd, threads_kept):
    uri = f"sqlite:///{tmp_path}/m.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": uri, "PREFECT_LOGGING_LEVEL": "WARNING"}
    seed_sqlite_store(uri)
    client = MlflowClient(uri)
    first = rlhf_run(tmp_path, env, "register:policy_version")
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert len(client.search_model_versions("name = 'rlhf-policy'")) == 1  # the orphan-to-be
    (parent,) = [r for r in client.search_runs(
        [client.get_experiment_by_name("rlhf-test").experiment_id])
        if "mlflow.parentRunId" not in r.data.tags]
    run_id = parent.info.run_id
    second = rlhf_run(tmp_path, env, "register:challenger", "--resume", run_id)
    assert second.returncode == -signal.SIGKILL, second.stderr[-3000:]
    # the resume that finishes runs in this process (no crash to survive: no new process)
    third = rlhf_in_process(run_args(tmp_path, "--resume", run_id), capfd,
                            PREFECT_API_URL=prefect_api, MLFLOW_TRACKING_URI=uri,
                            RLHF_CRASH_AT="")
    assert third.returncode == 0, third.stderr[-3000:]

    register = stage_children(client, client.get_run(run_id))["register"]
    assert register.info.status == "FINISHED"
    for name in ("rlhf-policy", "rlhf-reward-model"):
        (version,) = client.search_model_versions(f"name = '{name}'")
        assert version.run_id == register.info.run_id
        alias = "champion" if name == "rlhf-policy" else "challenger"  # a champion is no
        assert alias in client.get_model_version(name, version.version).aliases  # challenger
    (policy,) = client.search_model_versions("name = 'rlhf-policy'")
    tags = client.get_model_version("rlhf-policy", policy.version).tags
    assert tags["rlhf.parent_run_id"] == run_id and tags["rlhf.register.decision"] == "first"
    model = client.get_registered_model("rlhf-policy")
    assert model.aliases == {"champion": policy.version}  # promoted: no longer challenger
    moves = [json.loads(x) for x in model.tags["rlhf.alias_log"].splitlines()]
    assert [m["champion"] for m in moves] == [str(policy.version)]  # moved once

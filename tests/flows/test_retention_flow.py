"""Retention end to end: a run killed mid-PPO keeps every checkpoint; resumed to the end, its
models registered, its resume state is gone and its outputs stay; `rlhf run --resume` of the
finished run says it is finished and trains nothing again."""

import os
import signal
import subprocess
import sys

from mlflow.tracking import MlflowClient

from tests.shared import ROOT, TEST_CONFIG, pipeline_stages, rlhf_in_process
from tests.stores import seed_sqlite_store

CHECKPOINTS = ["sft.checkpoint_every=2", "reward.checkpoint_every=2", "ppo.checkpoint_every=1",
               "tracking.system_metrics=false"]


def run_args(tmp_path, *extra) -> list[str]:
    sets = [a for s in CHECKPOINTS + [f"tracking.workdir={tmp_path}/runs"] for a in ("--set", s)]
    return ["run", "--config", str(TEST_CONFIG), *sets, *extra]


def test_a_failed_run_keeps_its_resume_state_and_a_finished_one_drops_it(prefect_api, tmp_path,
                                                                        capfd, threads_kept):
    uri = f"sqlite:///{tmp_path}/m.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": prefect_api,
           "MLFLOW_TRACKING_URI": uri, "PREFECT_LOGGING_LEVEL": "WARNING",
           "RLHF_CRASH_AT": "ppo:rollout:3"}
    seed_sqlite_store(uri)
    killed = subprocess.run([sys.executable, "-m", "cli", *run_args(tmp_path)], cwd=tmp_path,
                            capture_output=True, text=True, timeout=600, env=env)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (folder,) = (tmp_path / "runs").iterdir()
    run_id = folder.name
    kept = sorted(p.parent.name for p in folder.rglob("checkpoints") if any(p.iterdir()))
    assert kept == ["ppo", "reward_model", "sft"]  # a stopped run keeps everything

    resumed = rlhf_in_process(run_args(tmp_path, "--resume", run_id), capfd,
                              PREFECT_API_URL=prefect_api, MLFLOW_TRACKING_URI=uri,
                              RLHF_CRASH_AT="")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    client = MlflowClient(uri)
    assert client.get_run(run_id).info.status == "FINISHED"
    assert str(client.get_model_version_by_alias("rlhf-policy", "champion").version) == "1"
    assert not list(folder.rglob("checkpoints"))
    for output in ("sft/model/model.safetensors", "ppo/policy/model.safetensors",
                   "reward_model/model/head.safetensors", "validate/sft.jsonl"):
        assert (folder / output).is_file(), output

    again = rlhf_in_process(run_args(tmp_path, "--resume", run_id), capfd,
                            PREFECT_API_URL=prefect_api, MLFLOW_TRACKING_URI=uri,
                            RLHF_CRASH_AT="")
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"run {run_id} is finished" in again.stderr
    assert "RLHF pipeline finished" in again.stdout
    parent = client.get_run(run_id)
    children = client.search_runs([parent.info.experiment_id],
                                  filter_string=f"tags.`mlflow.parentRunId` = '{run_id}'")
    assert sorted(r.data.tags["rlhf.stage"] for r in children) == sorted(pipeline_stages())
    assert len(client.search_model_versions("name = 'rlhf-policy'")) == 1

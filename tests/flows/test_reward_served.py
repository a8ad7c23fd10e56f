"""`rlhf run` with a served reward model beside the run's own (a real HTTP server, ended by its
PID): the server dies in PPO's first rollout, the command ends with exit 2 and the `--resume`
command, and the resume, with the server back, finishes the run with each source's metrics;
then the run's registered reward model under `mlflow models serve` answers a served source as
it scores in process, and a second run trains its policy against that server alone."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from rlhf_core.config import RewardSource
from tasks.pipeline.rewards import post_rows
from tasks.pipeline.stages.critic_init import FROM_POLICY
from tasks.platform.mlflow.models import load_pyfunc, pyfunc_scores
from tests.servers import (
    free_port,
    stage_children,
    start_model_server,
    start_scoring_server,
    stop,
    stop_group,
)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "test.yaml"


def rlhf(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run([sys.executable, "-m", "cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def test_a_served_reward_that_goes_down_stops_the_run_and_the_resume_finishes(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}/invocations"
    sources = (f"ppo.reward_sources=[{{name: rm}}, {{name: helpful, kind: http, target: "
               f"'{url}', weight: 0.1, retries: 1, timeout_s: 10}}]")
    server = start_scoring_server(port, "die-on-batch")  # answers the checks, then dies
    try:
        proc = rlhf(["run", "--config", str(CONFIG), "--set", sources], tmp_path)
    finally:
        stop(server)
    err = proc.stderr.strip().split("\n\n")[-1]
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in err
    assert re.search(r"reward source 'helpful': http://127.0.0.1:\d+/invocations did not "
                     r"answer after 2 tries", err), err
    resume = re.search(r"continue it with: (rlhf run .*--resume \w+)", err)
    assert resume, err
    run_id = resume.group(1).split()[-1]

    server = start_scoring_server(port)
    try:
        again = rlhf(["run", "--config", str(CONFIG), "--set", sources, "--resume", run_id],
                     tmp_path)
    finally:
        stop(server)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    ppo = stage_children(client, client.get_run(run_id))["ppo"]
    assert ppo.info.status == "FINISHED"
    assert ppo.data.tags["rlhf.reward_source.helpful"] == f"http {url}, weight 0.1"
    assert ppo.data.metrics["reward/helpful/raw_mean"] > 0  # the answers' lengths
    assert "reward/rm/raw_mean" in ppo.data.metrics

    # the run's registered reward model served by `mlflow models serve` answers a served
    # source's requests with the scores it gives in process
    uri, store = "models:/rlhf-reward-model/1", f"sqlite:///{tmp_path}/mlflow.db"
    prompts, answers = ["tell me about cats :", "hello :"], ["cats are nice .", "sure"]
    port = free_port()
    served = start_model_server(uri, store, tmp_path, port)
    served_url = f"http://127.0.0.1:{port}/invocations"
    try:
        remote = post_rows(RewardSource(name="served", kind="http", target=served_url),
                           prompts, answers)
        assert remote == pyfunc_scores(load_pyfunc(uri, store), prompts, answers)
        # PPO against the served model alone: no model source, so the critic starts from
        # the policy
        alone = rlhf(["run", "--config", str(CONFIG), "--set", "ppo.iterations=2", "--set",
                      f"ppo.reward_sources=[{{name: served, kind: http, target: "
                      f"'{served_url}'}}]"], tmp_path)
    finally:
        stop_group(served)
    assert alone.returncode == 0, alone.stdout[-2000:] + alone.stderr[-3000:]
    parent = re.search(r"MLflow parent run: (\w+)", alone.stdout)
    assert parent, alone.stdout[-2000:]
    stages = stage_children(client, client.get_run(parent.group(1)))
    assert stages["ppo"].data.tags["rlhf.reward_source.served"] == f"http {served_url}, weight 1.0"
    assert "reward/served/raw_mean" in stages["ppo"].data.metrics
    assert "reward/rm/raw_mean" not in stages["ppo"].data.metrics
    assert f"critic: {FROM_POLICY}" in alone.stdout, alone.stdout[-2000:]

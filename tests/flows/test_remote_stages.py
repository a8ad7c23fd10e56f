"""Stages on another machine, through a real Prefect server and a real `rlhf stage-worker`
subprocess (the "other machine": its own PREFECT_HOME, working folder and
RLHF_STAGE_WORKDIR). The pipeline runs with model.nnodes=2 (1 rank per node): SFT, the reward
model and PPO each start node 1 as a flow run of the worker's deployment while the
pipeline's task runs node 0. Routing to a deployment that does not exist is refused before
any run is opened; a routed stage no worker starts fails after routing.start_timeout_s and
its flow run is cancelled. (A routed stage run by a worker: tests/flows/test_serve.py, with
prefect.yaml's rlhf-stage/gpu on a process worker.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tasks.config.pipeline_config import load_config
from tests.flows.prefect_procs import base_env, stop, wait_deployment
from tests.shared import child_runs_by_stage

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "test.yaml"
WORKER = "rlhf-stage/other"
OVERRIDES = ["model.nnodes=2", "model.master_addr=127.0.0.1", f"routing.nodes={WORKER}",
             "routing.start_timeout_s=120", "ppo.iterations=2",
             "tracking.register_models=false"]
TRAINED = {"sft": "train/loss", "reward_model": "train/loss", "ppo": "objective/kl"}


def _config(tmp: Path, extra: list[str]):
    return load_config(CONFIG, OVERRIDES + extra + [
        f"tracking.tracking_uri=sqlite:///{tmp}/mlflow.db", f"tracking.workdir={tmp}/runs"])


@pytest.fixture(scope="module")
def other_machine(prefect_api, tmp_path_factory):
    """`rlhf stage-worker --name other` in its own folder -> (its folder, its stage root)."""
    from prefect.client.orchestration import get_client

    home = tmp_path_factory.mktemp("other_machine")
    env = {**base_env(home), "PREFECT_API_URL": prefect_api,
           "RLHF_STAGE_WORKDIR": str(home / "stages")}
    log = home / "worker.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "stage-worker", "--name",
                                 "other"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=home)
    try:
        with get_client(sync_client=True) as client:
            wait_deployment(client, WORKER, proc, log)
        yield home, home / "stages"
    finally:
        stop(proc)


@pytest.fixture(scope="module")
def spread_run(other_machine, tmp_path_factory):
    from flows.pipeline import rlhf_pipeline

    head = tmp_path_factory.mktemp("head")
    result = rlhf_pipeline(config=_config(head, []))
    return result, MlflowClient(f"sqlite:///{head}/mlflow.db"), head


def _flow_runs(deployment: str) -> dict:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        dep = client.read_deployment_by_name(deployment)
        runs = client.read_flow_runs(deployment_filter=DeploymentFilter(
            id=DeploymentFilterId(any_=[dep.id])))
    return {r.name: r for r in runs}


def test_nodes_of_every_data_parallel_stage_run_on_the_other_machine(spread_run,
                                                                    other_machine):
    result, client, head = spread_run
    _, stages_root = other_machine
    parent = result.parent_run_id
    there = stages_root / parent
    children = child_runs_by_stage(client, parent)
    for stage, metric in TRAINED.items():
        run = children[stage]
        assert run.info.status == "FINISHED", stage
        nodes = json.loads(run.data.tags["rlhf.nodes"])
        assert nodes["nnodes"] == 2 and nodes["master"].startswith("127.0.0.1:"), stage
        assert nodes["flow_runs"], stage
        assert (there / stage / "ranks_node1" / "spec.json").exists(), stage  # node 1 ran there
        assert not (head / "runs" / parent / stage / "ranks_node1").exists(), stage
        steps = [m.step for m in client.get_metric_history(run.info.run_id, metric)]
        assert len(steps) == len(set(steps)) > 0, stage  # rank 0 alone logged, once a step
        # rank 0 (node 0, here) wrote the output; node 1 wrote none
        assert (head / "runs" / parent / stage / "ranks" / "output.json").exists(), stage
        assert not (there / stage / "ranks_node1" / "output.json").exists(), stage
    assert "eval/rm_accuracy" in result.stages["reward_model"].metrics
    assert children["evaluate"].info.status == "FINISHED"
    runs = _flow_runs(WORKER)
    assert set(runs) == {"sft-node1", "reward_model-node1", "ppo-node1"}
    assert all(r.state.is_completed() for r in runs.values())


def test_a_missing_deployment_is_refused_before_any_run(prefect_api, tmp_path):
    from flows.pipeline import rlhf_pipeline
    from tasks.platform.prefect.remote import RoutingError

    cfg = _config(tmp_path, ["routing.stages.sft=rlhf-stage/nobody"])
    with pytest.raises(RoutingError, match="routing.stages.sft=rlhf-stage/nobody: no such "
                                           "deployment on the Prefect server"):
        rlhf_pipeline(config=cfg)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    assert exp is None or not client.search_runs([exp.experiment_id])


def test_a_stage_no_worker_starts_fails_and_its_flow_run_is_cancelled(prefect_api, tmp_path):
    from flows.pipeline import rlhf_pipeline
    from flows.stage import stage_deployment
    from tasks.platform.prefect.remote import RemoteStageError

    stage_deployment("idle").apply()  # a deployment nobody serves
    cfg = _config(tmp_path, ["routing.stages.sft=rlhf-stage/idle",
                             "routing.start_timeout_s=3"])
    with pytest.raises(RemoteStageError, match=r"stage sft: no worker started flow run \S+ "
                                               r"of rlhf-stage/idle within "
                                               r"routing.start_timeout_s=3 s"):
        rlhf_pipeline(config=cfg)
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.get_experiment_by_name(cfg.tracking.experiment)
    sft = [r for r in client.search_runs([exp.experiment_id])
           if r.data.tags.get("rlhf.stage") == "sft"]
    assert [r.info.status for r in sft] == ["FAILED"]
    (run,) = _flow_runs("rlhf-stage/idle").values()
    assert run.state.is_cancelled()

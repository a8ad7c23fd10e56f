"""`rlhf serve` against a real Prefect server, driven only through the Prefect API (what the
UI calls): the stored parameter schema; the retrain deployment's interval schedule starts a
run by itself (f) and a retrain triggered while that one trains is skipped (g); the pipeline
deployment with no parameters and with a one-field override (run side by side)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from mlflow.tracking import MlflowClient

from flows.config import load_config
from flows.serve import served_parameters
from tests.flows.prefect_procs import (
    ROOT,
    prefect_server,
    rlhf_serve,
    stop,
    wait_deployment,
    wait_run,
)
from tests.servers import stage_children
from tests.shared import STAGES

POOL = "rlhf-process"  # prefect.yaml's work pool
SECTIONS = {"model", "data", "sft", "reward", "ppo", "eval", "tracking"}
SCHEDULER = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
             "PREFECT_SERVER_SERVICES_SCHEDULER_MIN_RUNS": "1",
             "PREFECT_SERVER_SERVICES_SCHEDULER_MAX_RUNS": "3"}


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from prefect.client.orchestration import SyncPrefectClient

    tmp = tmp_path_factory.mktemp("serve")
    uri = f"sqlite:///{tmp}/mlflow.db"
    sets = [f"tracking.tracking_uri={uri}", f"tracking.workdir={tmp}/runs",
            "tracking.system_metrics=false", f"retrain.watch_dir={tmp}/batches",
            "retrain.schedule.interval_s=10", "demo.n_eval=200", "retrain.gate.num_prompts=200"]
    args = ["--config", str(ROOT / "configs" / "test.yaml"), "--name", "test"]
    for item in sets:
        args += ["--set", item]
    with prefect_server(tmp / "server", SCHEDULER) as (api, env):
        with rlhf_serve(env, tmp, args) as (proc, log), SyncPrefectClient(api) as client:
            pipeline = wait_deployment(client, "rlhf_pipeline/test", proc, log)
            retrain = wait_deployment(client, "retrain/test", proc, log)
            yield {"client": client, "pipeline": pipeline, "retrain": retrain,
                   "mlflow": MlflowClient(uri), "log": log, "env": env}


def _runs_of(client, deployment_id):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(
        id=DeploymentFilterId(any_=[deployment_id])))


def _decision(client, flow_run_id) -> str:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    arts = client.read_artifacts(artifact_filter=ArtifactFilter(
        flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(str(a.data) for a in arts if a.key == "rlhf-retrain-decision")


def test_parameter_schema_has_typed_sections_with_descriptions(served):
    deployment = served["pipeline"]
    schema = deployment.parameter_openapi_schema
    props, defs = schema["properties"], schema["definitions"]
    assert SECTIONS <= set(props)
    assert props["ppo"]["$ref"] == "#/definitions/PPOConfig"
    assert props["ppo"]["description"].startswith("PPO")
    kl = defs["PPOConfig"]["properties"]["kl_coef"]
    assert kl["type"] == "number" and "KL" in kl["description"]
    # the form starts from the served config (demo on), not a bare config's defaults
    assert deployment.parameters["demo"]["enabled"] is True
    assert deployment.parameters["ppo"]["iterations"] == 3


def test_schedule_starts_a_retrain_and_a_second_one_does_not_train(served):
    client, deployment = served["client"], served["retrain"]
    deadline, first = time.time() + 240, None
    while time.time() < deadline and first is None:  # (f) nobody triggers this one
        running = [r for r in _runs_of(client, deployment.id)
                   if r.state and r.state.type.value == "RUNNING"]
        limit = client.read_global_concurrency_limit_by_name("rlhf-retrain-rlhf-policy")
        first = running[0] if running and limit.active_slots else None
        time.sleep(0.5)
    assert first is not None, served["log"].read_text()[-3000:]
    assert "auto-scheduled" in first.tags
    second = client.create_flow_run_from_deployment(deployment.id)  # (g) while it trains
    second = wait_run(client, second.id, timeout=240)
    # the deployment's concurrency limit cancels it before it starts (recorded as its
    # state); had it started, the flow's own slot would have skipped it
    if second.state.type.value == "CANCELLED":
        assert "concurrency" in (second.state.message or "").lower(), second.state
    else:
        assert second.state.type.value == "COMPLETED" and "skipped" in \
            _decision(client, second.id)
    first = wait_run(client, first.id, timeout=300)
    assert first.state.type.value == "COMPLETED", served["log"].read_text()[-3000:]
    assert "first champion" in _decision(client, first.id)
    client.pause_deployment(deployment.id)  # no more scheduled runs while the rest runs
    assert deployment.global_concurrency_limit.limit == 1
    assert deployment.concurrency_options.collision_strategy.value == "CANCEL_NEW"
    retrains = served["mlflow"].search_runs(
        [e.experiment_id for e in served["mlflow"].search_experiments()],
        filter_string="tags.`rlhf.retrain` = 'true'")
    assert len([r for r in retrains if "mlflow.parentRunId" not in r.data.tags]) == 1


@pytest.fixture(scope="module")
def pipeline_runs(served):
    client, deployment = served["client"], served["pipeline"]
    plain = client.create_flow_run_from_deployment(deployment.id, parameters={})
    override = client.create_flow_run_from_deployment(
        deployment.id, parameters={"ppo": {"kl_coef": 0.123}})
    return {"plain": wait_run(client, plain.id), "override": wait_run(client, override.id)}


def _parent_params(mlflow_client: MlflowClient, flow_run_id) -> dict:
    runs = mlflow_client.search_runs(
        [e.experiment_id for e in mlflow_client.search_experiments()],
        filter_string=f"tags.`rlhf.prefect_flow_run_id` = '{flow_run_id}'")
    assert len(runs) == 1, runs
    return runs[0].data.params


def test_run_with_no_parameters_runs_the_served_config(served, pipeline_runs):
    run = pipeline_runs["plain"]
    assert run.state.type.value == "COMPLETED", served["log"].read_text()[-3000:]
    params = _parent_params(served["mlflow"], run.id)
    assert params["demo.enabled"] == "True" and params["ppo.iterations"] == "3"
    assert params["ppo.kl_coef"] == "0.05"


def test_one_field_override_keeps_the_rest_and_shows_in_mlflow(served, pipeline_runs):
    run = pipeline_runs["override"]
    assert run.state.type.value == "COMPLETED", served["log"].read_text()[-3000:]
    params = _parent_params(served["mlflow"], run.id)
    assert params["ppo.kl_coef"] == "0.123"
    assert params["ppo.iterations"] == "3" and params["ppo.rollout_batch_size"] == "16"




@pytest.fixture(scope="module")
def yaml_deployed(served):
    """prefect.yaml's deployments on the served Prefect server, in a process work pool."""
    prefect = [sys.executable, "-m", "prefect"]
    subprocess.run([*prefect, "work-pool", "create", POOL, "--type", "process"],
                   env=served["env"], cwd=ROOT, check=True, capture_output=True, timeout=120)
    out = subprocess.run([*prefect, "--no-prompt", "deploy", "--all"], env=served["env"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return served["client"].read_deployment_by_name("rlhf_pipeline/demo")


def test_prefect_deploy_registers_the_prefect_yaml_deployments(served, yaml_deployed):
    client, pipeline = served["client"], yaml_deployed
    assert pipeline.work_pool_name == POOL
    assert pipeline.parameters["demo"]["enabled"] is True
    assert "PPOConfig" in pipeline.parameter_openapi_schema["definitions"]
    assert client.read_deployment_by_name("retrain/demo").work_pool_name == POOL
    # the checkout is found on the worker at run time, not where `prefect deploy` ran
    assert pipeline.pull_steps == [{"prefect.deployments.steps.set_working_directory": {
        "directory": "{{ $RLHF_REPO_DIR }}"}}]


def test_process_worker_runs_the_prefect_yaml_pipeline(served, yaml_deployed, tmp_path):
    """`prefect worker start --pool` (another folder, as on another machine) picks up a run
    of prefect.yaml's pipeline deployment, triggered through the API with the test config's
    sizes and a tracking store of its own, and the run lands in that store."""
    client, store = served["client"], tmp_path / "store"
    uri = f"sqlite:///{store}/mlflow.db"
    small = load_config(ROOT / "configs" / "test.yaml", [
        f"tracking.tracking_uri={uri}", f"tracking.workdir={store}/runs",
        "tracking.system_metrics=false", "tracking.experiment=rlhf-worker"])
    log = tmp_path / "worker.log"
    env = {**served["env"], "RLHF_REPO_DIR": str(ROOT), "PREFECT_WORKER_QUERY_SECONDS": "1",
           "PREFECT_WORKER_PREFETCH_SECONDS": "1"}
    with open(log, "w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start",
                                   "--pool", POOL, "--limit", "1"], env=env, cwd=tmp_path,
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        run = client.create_flow_run_from_deployment(yaml_deployed.id,
                                                     parameters=served_parameters(small))
        run = wait_run(client, run.id, timeout=300)
    finally:
        stop(worker)
    assert run.state.type.value == "COMPLETED", log.read_text()[-3000:]
    mlflow = MlflowClient(uri)
    exp = mlflow.get_experiment_by_name("rlhf-worker")
    parents = mlflow.search_runs([exp.experiment_id],
                                 filter_string=f"tags.`rlhf.prefect_flow_run_id` = '{run.id}'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert parents[0].data.params["ppo.iterations"] == "3"  # the override, not the demo's 60
    stages = stage_children(mlflow, parents[0])
    assert sorted(stages) == sorted(STAGES)
    assert all(r.info.status == "FINISHED" for r in stages.values())
    champion = mlflow.get_model_version_by_alias("rlhf-policy", "champion")
    assert champion.run_id == stages["register"].info.run_id

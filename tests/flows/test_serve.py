"""`rlhf serve` against a real Prefect server, driven only through the Prefect API (what the
UI calls): the stored parameter schema; the retrain deployment's interval schedule starts a
run by itself (f) and a retrain triggered while that one trains is skipped (g); the pipeline
deployment with no parameters and with a one-field override (run side by side)."""

from __future__ import annotations

import time

import pytest
from mlflow.tracking import MlflowClient

from tests.flows.prefect_procs import (
    ROOT,
    prefect_server,
    rlhf_serve,
    wait_deployment,
    wait_run,
)

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




def test_prefect_deploy_registers_the_prefect_yaml_deployments(served):
    import subprocess
    import sys

    env = {**served["env"], "RLHF_REPO_DIR": str(ROOT)}
    prefect = [sys.executable, "-m", "prefect"]
    subprocess.run([*prefect, "work-pool", "create", "rlhf-process", "--type", "process"],
                   env=env, cwd=ROOT, check=True, capture_output=True, timeout=120)
    out = subprocess.run([*prefect, "--no-prompt", "deploy", "--all"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    client = served["client"]
    pipeline = client.read_deployment_by_name("rlhf_pipeline/demo")
    assert pipeline.work_pool_name == "rlhf-process"
    assert pipeline.parameters["demo"]["enabled"] is True
    assert "PPOConfig" in pipeline.parameter_openapi_schema["definitions"]
    assert client.read_deployment_by_name("retrain/demo").work_pool_name == "rlhf-process"
